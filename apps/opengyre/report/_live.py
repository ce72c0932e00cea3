"""The live dashboard: follow the log, fold each event as it arrives, redraw a rich view now and then.

It runs as tasks on the caller's loop and never blocks it: the fold of an event is a few dict updates, and a
redraw (which builds the summary, linear in the run's events) happens at most once per ``refresh_s``, only after
something changed, and never takes more than ~5% of the loop's time (a long run's redraws are spaced out).
Stopping it (the ``stop`` event, or leaving ``live_dashboard``'s block) ends the subscription and then reads the
log up to its end at that moment, so the final summary is the fold of every event appended before the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from rich.console import Console
from rich.live import Live

from ..eventlog import EventLog
from ._fold import FOLDED_TYPES, RunFold
from ._model import RunSummary
from ._read import fold_log
from ._tables import dashboard_view

__all__ = ["LiveDashboard", "live_dashboard"]


class LiveDashboard:
    """Follows ``log`` from ``start_seq`` (default: the first event) and shows the run on ``console``."""

    def __init__(
        self,
        log: EventLog,
        *,
        start_seq: int = 1,
        console: Console | None = None,
        refresh_s: float = 0.5,
        title: str = "OpenGyre run",
    ) -> None:
        if start_seq < 1:
            raise ValueError("start_seq starts at 1")
        self.log = log
        self.start_seq = start_seq
        self.console = console or Console()
        self.refresh_s = refresh_s
        self.title = title
        self.fold = RunFold()
        self._dirty = True

    @property
    def summary(self) -> RunSummary:
        """The run as folded so far."""
        return self.fold.summary()

    async def _follow(self) -> None:
        sub = self.log.subscribe(*FOLDED_TYPES, start_seq=self.start_seq)
        async with contextlib.aclosing(sub):
            async for seq, event in sub:
                self.fold.apply(seq, event)
                self._dirty = True

    def _draw(self, live: Live) -> float:
        """Redraw; the seconds it took (building the summary is linear in the run's events)."""
        started = time.perf_counter()
        live.update(dashboard_view(self.fold.summary(), title=self.title), refresh=True)
        self._dirty = False
        return time.perf_counter() - started

    async def run(self, stop: asyncio.Event) -> RunSummary:
        """Show the run until ``stop`` is set; then fold what remains up to the log's end and return the summary.
        An error of the subscription ends it too, raised here."""
        follower = asyncio.create_task(self._follow(), name="report-follow")
        live = Live(console=self.console, auto_refresh=False, transient=False)
        live.start()
        try:
            pause = self.refresh_s
            while not stop.is_set() and not follower.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), pause)
                if self._dirty and not stop.is_set():
                    # A long run's redraw costs more: space them so they take at most ~5% of the loop.
                    pause = max(self.refresh_s, 20 * self._draw(live))
            if follower.done():
                follower.result()  # the subscription failed: say why
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            end = await self.log.last_seq()
            start = max(self.start_seq, self.fold.last_seq + 1)
            if end >= start:
                await fold_log(self.log, self.fold, start_seq=start, end_seq=end)
            self._draw(live)
        finally:
            if not follower.done():
                follower.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await follower
            live.stop()
        return self.fold.summary()


@contextlib.asynccontextmanager
async def live_dashboard(
    log: EventLog,
    *,
    start_seq: int = 1,
    console: Console | None = None,
    refresh_s: float = 0.5,
    title: str = "OpenGyre run",
) -> AsyncIterator[LiveDashboard]:
    """``async with live_dashboard(log) as dash: <run>``; after the block ``dash.summary`` covers every event
    appended before the block ended. The dashboard runs beside the block on the same loop."""
    dash = LiveDashboard(log, start_seq=start_seq, console=console, refresh_s=refresh_s, title=title)
    stop = asyncio.Event()
    runner = asyncio.create_task(dash.run(stop), name="report-dashboard")
    try:
        yield dash
    finally:
        stop.set()
        await runner
