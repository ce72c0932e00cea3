"""What an actuator does to a cell's machines. The order of the role-change protocol, and the event after each
step, belong to ``RoleChanger`` (``_actuation``); an actuator only knows how to do each step on its hardware."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

from .._state import CellState
from ._drain import Drainer, NoDrainer

__all__ = ["Actuator", "ActuatorError"]


class ActuatorError(Exception):
    """A step failed on the machines (the engine did not come up, the drain timed out, ...)."""


class Actuator(ABC):
    name: ClassVar[str]

    def __init__(self, drainer: Drainer | None = None) -> None:
        self.drainer = drainer or NoDrainer()

    async def drain(self, cell: CellState) -> int:
        """Routing to the cell's engine has stopped (the draining event is on the log): abort its in-flight
        requests and have them rerouted, and return once the proxy confirms; the number rerouted."""
        return await self.drainer.drain(cell.cell_id, cell.engine_url)

    @abstractmethod
    async def release_engine(self, cell: CellState) -> None:
        """Free the cell's accelerators from the engine (stop it, or release its memory)."""

    @abstractmethod
    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        """Start the cell's trainer worker; ``core`` holds the authoritative weights and optimizer state."""

    @abstractmethod
    async def stop_trainer(self, cell: CellState) -> None:
        """Stop the cell's trainer worker (its claimed micro-step, if any, goes back to the buffer)."""

    @abstractmethod
    async def start_engine(self, cell: CellState) -> str | None:
        """Bring the cell's engine (back) up; return its URL for the proxy's pool (None: unchanged)."""

    async def close(self) -> None:
        """Stop everything this actuator started."""
        return None
