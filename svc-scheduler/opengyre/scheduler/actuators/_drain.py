"""How an actuator asks the proxy to drain a cell's engine. The proxy also drains on the draining event by
itself; the explicit call is the confirmation the protocol waits for before releasing the engine."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Drainer", "NoDrainer"]


class Drainer(Protocol):
    async def drain(self, cell_id: str, engine_url: str | None) -> int:
        """Return once no request is in flight on the cell's engine; the number rerouted."""
        ...


class NoDrainer:
    """No proxy in front of the engines (the simulator, a bare test): nothing to reroute."""

    async def drain(self, cell_id: str, engine_url: str | None) -> int:
        return 0
