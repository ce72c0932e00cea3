"""An actuator for cells whose machines someone else runs: the role-change events (and the proxy's drain) are
all it does. ``opengyre service run scheduler`` uses it unless told to start processes."""

from __future__ import annotations

from typing import ClassVar

from .._state import CellState
from ._base import Actuator

__all__ = ["ExternalActuator"]


class ExternalActuator(Actuator):
    name: ClassVar[str] = "external"

    async def release_engine(self, cell: CellState) -> None:
        return None

    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        return None

    async def stop_trainer(self, cell: CellState) -> None:
        return None

    async def start_engine(self, cell: CellState) -> str | None:
        return None
