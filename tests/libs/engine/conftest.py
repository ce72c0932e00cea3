"""The engine's fixtures: real CPU engines in this process (shared with the proxy's tests)."""

from ..._engines import engine_a, engine_b, one_torch_thread

__all__ = ["engine_a", "engine_b", "one_torch_thread"]
