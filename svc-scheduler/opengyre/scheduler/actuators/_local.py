"""The local actuator: each cell's CPU engine and trainer worker are real child processes on this machine.

Leaving rollout stops the cell's engine process (after the proxy moved its requests); arriving in training
starts ``python -m opengyre.scheduler.worker`` for the cell, which claims micro-steps from the scheduler.
Coming back stops the worker and starts a fresh engine, whose URL goes on the ``switching -> rollout`` event.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar

from .._state import CellState
from ._base import Actuator
from ._drain import Drainer, NoDrainer
from ._process import ChildProcess

__all__ = ["DEFAULT_ENGINE_ARGV", "DEFAULT_TRAINER_ARGV", "LocalActuator"]

# Placeholders: {cell}, {ready_file}, {scheduler}, {role}.
DEFAULT_ENGINE_ARGV: tuple[str, ...] = (
    sys.executable, "-m", "opengyre.proxy.engine", "--preset", "tiny", "--port", "0", "--port-file", "{ready_file}",
    "--threads", "1",
)  # fmt: skip
DEFAULT_TRAINER_ARGV: tuple[str, ...] = (
    sys.executable, "-m", "opengyre.scheduler.worker", "--cell", "{cell}", "--scheduler", "{scheduler}",
    "--role", "{role}", "--ready-file", "{ready_file}",
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
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.scheduler_addr = scheduler_addr
        self.drainer = drainer or NoDrainer()
        self.engine_argv = list(engine_argv)
        self.trainer_argv = list(trainer_argv)
        self.env = dict(env or {})
        self.start_timeout = start_timeout
        self.engines: dict[str, ChildProcess] = {}
        self.trainers: dict[str, ChildProcess] = {}

    def _child(self, kind: str, cell: CellState, argv: Sequence[str], role: str = "") -> ChildProcess:
        ready = self.workdir / f"{cell.cell_id}.{kind}.ready"
        fields = {"cell": cell.cell_id, "ready_file": str(ready), "scheduler": self.scheduler_addr, "role": role}
        return ChildProcess(
            f"{kind} of {cell.cell_id}", [a.format(**fields) for a in argv], ready_file=ready,
            log_file=self.workdir / f"{cell.cell_id}.{kind}.log",
        )  # fmt: skip

    async def start_engine(self, cell: CellState) -> str | None:
        old = self.engines.pop(cell.cell_id, None)
        if old is not None:
            await old.stop()
        child = self._child("engine", cell, self.engine_argv)
        url = await child.start(timeout=self.start_timeout, env=self.env)
        self.engines[cell.cell_id] = child
        return url

    async def drain(self, cell: CellState) -> int:
        return await self.drainer.drain(cell.cell_id, cell.engine_url)

    async def release_engine(self, cell: CellState) -> None:
        child = self.engines.pop(cell.cell_id, None)
        if child is not None:  # an engine someone else started is not ours to stop
            await child.stop()

    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        old = self.trainers.pop(cell.cell_id, None)
        if old is not None:
            await old.stop()
        child = self._child("trainer", cell, self.trainer_argv, "core" if core else "satellite")
        await child.start(timeout=self.start_timeout, env=self.env)
        self.trainers[cell.cell_id] = child

    async def stop_trainer(self, cell: CellState) -> None:
        child = self.trainers.pop(cell.cell_id, None)
        if child is not None:
            await child.stop()

    async def adopt(self, cells: Sequence[CellState]) -> dict[str, str]:
        """Start an engine for every rollout cell that has none yet (a fresh local stack); cell -> URL."""
        urls: dict[str, str] = {}
        for c in cells:
            if c.role == "rollout" and c.cell_id not in self.engines:
                url = await self.start_engine(c)
                if url:
                    urls[c.cell_id] = url
        return urls

    async def close(self) -> None:
        for group in (self.trainers, self.engines):
            for child in list(group.values()):
                await child.stop()
            group.clear()
