"""Satellite processes that follow the cells' roles in the log (``follow_cell_roles``).

The scheduler decides roles and appends them as ``cell-role-changed``; the trainer's projection folds them by the
cell aggregate's rule. The trainer meets the scheduler only there (no call between the services): between
micro-steps it reads the roles and makes its satellites match them —

- a cell in ``training-satellite`` gets a satellite process (``CellHub.start``, started off the loop: a process
  takes seconds to come up) that joins the running step as soon as it is up, else the next one;
- a satellite whose cell left that role (``training-satellite -> switching``, or promoted to core) leaves between
  micro-steps: the micro-batch in hand is finished and its gradients count, it takes no other, and the process is
  closed once it has sent them — nothing is dropped, nothing is trained twice;
- the core is the cell in ``training-core``: this process, which holds the authoritative weights and optimizer
  state; a step starts only while there is one.

A satellite that fails (killed, or failing to start) fails the step loudly, never a step missing its work.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from ._cell_process import ProcessSatellite
from ._streaming import StepFinished, StreamingStep

__all__ = ["RoleCells"]


class RoleCells:
    """The trainer's satellites as the cells' roles say. ``roles``: cell id -> role (the projection's fold);
    ``start``: a satellite process for a cell id (blocking; run on a thread)."""

    def __init__(self, roles: Callable[[], Mapping[str, str]], start: Callable[[str], ProcessSatellite]) -> None:
        self._roles = roles
        self._start = start
        self.core: str | None = None  # the cell in training-core, as last read
        self.live: dict[str, ProcessSatellite] = {}  # serving satellites, by cell
        self._starting: dict[str, asyncio.Task[ProcessSatellite]] = {}
        self._leaving: dict[str, ProcessSatellite] = {}
        self._joined: dict[str, StreamingStep] = {}  # the step each satellite last joined
        self.left: list[str] = []  # cells whose satellite process was closed, in order
        self._closed = False

    async def sync(self, step: StreamingStep | None) -> None:
        """Match the satellites to the roles now; bring any satellite that is up into ``step`` (the running one)."""
        roles = await asyncio.to_thread(self._roles)
        cores = sorted(c for c, r in roles.items() if r == "training-core")
        self.core = cores[0] if cores else None
        want = {c for c, r in roles.items() if r == "training-satellite"}
        for cell in sorted(want - self.live.keys() - self._starting.keys() - self._leaving.keys()):
            self._starting[cell] = asyncio.create_task(asyncio.to_thread(self._start_cell, cell))
        for cell, task in list(self._starting.items()):
            if task.done():
                del self._starting[cell]
                try:
                    self.live[cell] = task.result()
                except Exception as exc:
                    raise RuntimeError(f"the satellite of cell {cell} did not start: {exc!r}") from exc
        for cell in sorted(self.live.keys() - want):
            sat = self.live.pop(cell)
            sat.leave()  # between micro-steps: the one in hand is finished and counts
            self._leaving[cell] = sat
        if step is not None:
            for cell, sat in self.live.items():
                if self._joined.get(cell) is step:
                    continue
                sat.worked.clear()
                try:
                    step.join(sat)
                except StepFinished:
                    break  # the step is over: they join the next one
                self._joined[cell] = step
        for cell, sat in list(self._leaving.items()):
            # Closed once its gradients are in the core's hands (or it never joined a running step).
            if cell not in self._joined or sat.worked.is_set():
                await self._close(cell, sat)

    async def after_step(self) -> None:
        """The step is over: every leaving satellite has sent what it did; close them."""
        self._joined.clear()
        for cell, sat in list(self._leaving.items()):
            await self._close(cell, sat)

    async def _close(self, cell: str, sat: ProcessSatellite) -> None:
        del self._leaving[cell]
        self._joined.pop(cell, None)
        await asyncio.to_thread(sat.close)
        self.left.append(cell)

    def _start_cell(self, cell: str) -> ProcessSatellite:
        sat = self._start(cell)
        if self._closed:  # closed while it came up: nobody else would end it
            sat.close()
            raise RuntimeError("the trainer closed while the satellite started")
        return sat

    def close(self) -> None:
        """End every satellite process (one still starting ends as soon as it is up)."""
        self._closed = True
        for sat in [*self.live.values(), *self._leaving.values()]:
            sat.close()
        self.live.clear()
        self._leaving.clear()
