"""Engines follow cells: cell-registered / cell-role-changed events add rollout engines and drain the rest.

The watcher reads every cell event from the start of the log (so a restarted proxy learns the current roles)
and then follows new ones; draining is what moves in-flight requests when the scheduler turns a rollout cell
into a training cell.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opengyre.eventlog import EventLog
from opengyre.events import CellEngineChanged, CellRegistered, CellRoleChanged
from opengyre.retry import backoff

from ._pool import EnginePool

__all__ = ["CellWatcher"]

log = logging.getLogger(__name__)


class CellWatcher:
    def __init__(self, event_log: EventLog, pool: EnginePool) -> None:
        self.log = event_log
        self.pool = pool
        self.urls: dict[str, str] = {}  # cell -> engine URL, remembered across role changes
        self.roles: dict[str, str] = {}
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
                cells = self.log.subscribe(CellRegistered, CellRoleChanged, CellEngineChanged, start_seq=next_seq)
                async with contextlib.aclosing(cells) as events:
                    async for seq, event in events:
                        next_seq = seq + 1
                        await self.apply(event)

    async def apply(self, event: object) -> None:
        role: str
        if isinstance(event, CellRegistered):
            cell, role, url = event.cell_id, event.role, event.engine_url
        elif isinstance(event, CellRoleChanged):
            cell, role, url = event.cell_id, event.to_role, event.engine_url
        elif isinstance(event, CellEngineChanged):  # same role, a new engine: a rollout cell is re-pointed
            cell, url = event.cell_id, event.engine_url
            if cell not in self.roles:
                log.warning("engine change of unknown cell %s", cell)
                return
            role = self.roles[cell]
        else:
            return
        self.applied += 1
        if url:
            self.urls[cell] = url
        self.roles[cell] = role
        if role == "rollout":
            if cell not in self.urls:
                log.warning("cell %s is a rollout cell without an engine_url", cell)
                return
            try:
                await self.pool.add(cell, self.urls[cell], source="cell")
            except ValueError as exc:  # a URL no engine client speaks: skip the cell, keep following the others
                log.warning("cell %s: %s", cell, exc)
        elif self.pool.get(cell) is not None:
            # Drain in the background: the watcher must keep reading while requests move.
            task = asyncio.create_task(self.pool.drain(cell), name=f"drain-{cell}")
            self._drains.add(task)
            task.add_done_callback(self._drains.discard)
