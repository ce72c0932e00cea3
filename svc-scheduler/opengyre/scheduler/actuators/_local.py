"""The local actuator: each cell's CPU engine and trainer worker are real child processes on this machine.

Leaving rollout stops the cell's engine process (after the proxy moved its requests); arriving in training
starts ``python -m opengyre.scheduler.worker`` for the cell, which claims micro-steps from the scheduler.
Coming back stops the worker and starts a fresh engine, whose URL goes on the ``switching -> rollout`` event.

The default worker is the ``--stand-in`` (it trains nothing): the real training follows the role events in the
trainer service (``follow_cell_roles``), which starts and stops its satellite processes itself; a deployment
with another trainer gives ``trainer_argv`` (``--train module:function``, or a launcher of its own).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from .._state import CellState
from ._base import Actuator
from ._drain import Drainer
from ._process import ChildProcesses

__all__ = ["DEFAULT_ENGINE_ARGV", "DEFAULT_TRAINER_ARGV", "LocalActuator"]

# Placeholders: {cell}, {ready_file}, {scheduler}, {role}.
DEFAULT_ENGINE_ARGV: tuple[str, ...] = (
    sys.executable, "-m", "opengyre.engine", "--preset", "tiny", "--port", "0", "--port-file", "{ready_file}",
    "--threads", "1",
)  # fmt: skip
DEFAULT_TRAINER_ARGV: tuple[str, ...] = (
    sys.executable, "-m", "opengyre.scheduler.worker", "--cell", "{cell}", "--scheduler", "{scheduler}",
    "--role", "{role}", "--ready-file", "{ready_file}", "--stand-in",
)  # fmt: skip


class LocalActuator(Actuator):
    name: ClassVar[str] = "local"

    def __init__(
        self,
        workdir: Path,
        *,
        scheduler_addr: str = "",
        drainer: Drainer | None = None,
        engine_argv: Sequence[str] = DEFAULT_ENGINE_ARGV,
        trainer_argv: Sequence[str] = DEFAULT_TRAINER_ARGV,
        env: Mapping[str, str] | None = None,
        start_timeout: float = 180.0,
    ) -> None:
        super().__init__(drainer)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scheduler_addr = scheduler_addr
        self.engine_argv = list(engine_argv)
        self.trainer_argv = list(trainer_argv)
        self.env = dict(env or {})
        self.start_timeout = start_timeout
        self.engines = ChildProcesses("engine", self.workdir, self.env)
        self.trainers = ChildProcesses("trainer", self.workdir, self.env)

    def _fields(self, cell: CellState, role: str = "") -> dict[str, str]:
        return {"cell": cell.cell_id, "scheduler": self.scheduler_addr, "role": role}

    async def start_engine(self, cell: CellState) -> str | None:
        return await self.engines.start(cell.cell_id, self.engine_argv, self._fields(cell), timeout=self.start_timeout)

    async def release_engine(self, cell: CellState) -> None:
        await self.engines.stop(cell.cell_id)

    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        role = "core" if core else "satellite"
        await self.trainers.start(cell.cell_id, self.trainer_argv, self._fields(cell, role), timeout=self.start_timeout)

    async def stop_trainer(self, cell: CellState) -> None:
        await self.trainers.stop(cell.cell_id)

    async def close(self) -> None:
        await self.trainers.close()
        await self.engines.close()
