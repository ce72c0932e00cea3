"""Engines follow cells: cell-registered / cell-role-changed events add rollout engines and drain the rest.

The watcher reads every cell event from the start of the log (so a restarted proxy learns the current roles)
and then follows new ones; draining is what moves in-flight requests when the scheduler turns a rollout cell
into a training cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import cast

from opengyre.aggregates import CELL_EVENTS, Cell, CellEvent, cell_key, evolve_cell
from opengyre.eventlog import EventLog
from opengyre.events import Event
from opengyre.projection import Rejected
from opengyre.retry import backoff

from ._pool import EnginePool

__all__ = ["CellWatcher"]

log = logging.getLogger(__name__)


class CellWatcher:
    def __init__(self, event_log: EventLog, pool: EnginePool) -> None:
        self.log = event_log
        self.pool = pool
        self.cells: dict[str, Cell] = {}
        self.applied = 0
        self._task: asyncio.Task[None] | None = None
        self._drains: set[asyncio.Task[int]] = set()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="proxy-cell-watcher")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()  # closing the subscription deletes its consumer
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for t in list(self._drains):
            t.cancel()

    async def _run(self) -> None:
        # From the first event: a restarted proxy learns the current roles. Cell events of a newer or unknown
        # shape are skipped by the subscription: not ours to judge. The subscription waits out a server that
        # is away; anything else it raises must not end the watcher, which would stop following cells.
        next_seq = 1
        async for attempt in backoff("following cell events failed; resuming", first_s=0.5, max_s=10.0, logger=log):
            with attempt:
                cells = self.log.subscribe(*CELL_EVENTS, start_seq=next_seq)
                async with contextlib.aclosing(cells) as events:
                    async for seq, event in events:
                        next_seq = seq + 1
                        await self.apply(event, seq)

    @property
    def urls(self) -> dict[str, str]:
        """cell -> engine URL, remembered across role changes."""
        return {c.cell_id: c.engine_url for c in self.cells.values() if c.engine_url}

    @property
    def roles(self) -> dict[str, str]:
        return {c.cell_id: c.role for c in self.cells.values()}

    async def apply(self, event: Event, seq: int = 0) -> None:
        cell_id = cell_key(event)
        if cell_id is None:
            return
        try:  # the cell aggregate's rule, as the scheduler and the trainer fold it
            cell = evolve_cell(self.cells.get(cell_id), cast(CellEvent, event), seq)
        except Rejected as exc:  # a refused event changes nothing: keep following the others
            log.warning("cell event skipped (%s): %s", exc.reason, exc)
            return
        self.cells[cell_id] = cell
        self.applied += 1
        role, url = cell.role, cell.engine_url
        if role == "rollout":
            if not url:
                log.warning("cell %s is a rollout cell without an engine_url", cell_id)
                return
            try:
                await self.pool.add(cell_id, url, source="cell")
            except ValueError as exc:  # a URL no engine client speaks: skip the cell, keep following the others
                log.warning("cell %s: %s", cell_id, exc)
        elif self.pool.get(cell_id) is not None:
            # Drain in the background: the watcher must keep reading while requests move.
            task = asyncio.create_task(self.pool.drain(cell_id), name=f"drain-{cell_id}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
