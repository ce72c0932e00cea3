"""The built-in CPU rollout engine: the shared policy model behind SGLang's native API and OpenAI routes.

Start one in this process with ``EngineServer`` or as a child process with ``EngineProcess``; see
``docs/proxy.md``.
"""

from ._engine import CpuEngine, EngineConfig, Generation
from ._launch import EngineProcess, EngineServer, serve_forever
from ._sampling import SamplingError, SamplingParams
from ._scheduler import RequestRecord

__all__ = [
    "CpuEngine",
    "EngineConfig",
    "EngineProcess",
    "EngineServer",
    "Generation",
    "RequestRecord",
    "SamplingError",
    "SamplingParams",
    "serve_forever",
]
