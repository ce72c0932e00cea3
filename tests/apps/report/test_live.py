"""The live dashboard follows a real log while events arrive, stops when asked, and ends on the whole fold."""

from __future__ import annotations

import asyncio
import io

from rich.console import Console

from opengyre.eventlog import EventLog
from opengyre.events import SkillIngested
from opengyre.report import LiveDashboard, live_dashboard, summarize

from ..._polling import await_until
from ._run import scripted_run


def _console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, width=160, force_terminal=False), out


async def test_the_dashboard_follows_the_log_and_ends_on_the_fold_of_everything_appended(event_log: EventLog) -> None:
    events = scripted_run(3)
    half = len(events) // 2
    before = SkillIngested(skill_id="earlier-run", name="x", description="d")
    await event_log.append(before)  # seq 1: not part of the run the dashboard follows
    console, out = _console()
    async with live_dashboard(event_log, start_seq=2, console=console, refresh_s=0.05) as dash:
        await event_log.append_many(events[:half])
        await await_until(lambda: dash.fold.last_seq == 1 + half, "the dashboard folded the first half")
        midway = dash.summary
        await event_log.append_many(events[half:])  # the block ends at once: the rest is read on the way out
    assert midway == await summarize(event_log, start_seq=2, end_seq=1 + half)
    assert dash.summary == await summarize(event_log, start_seq=2)
    assert dash.summary.events == len(events) and dash.summary.first_seq == 2
    text = out.getvalue()
    assert "OpenGyre run" in text and "reward per training step" in text and "cells" in text


async def test_a_dashboard_stops_when_asked_while_nothing_arrives_and_never_holds_the_loop(event_log: EventLog) -> None:
    console, _ = _console()
    stop = asyncio.Event()
    dash = LiveDashboard(event_log, console=console, refresh_s=0.05)
    runner = asyncio.create_task(dash.run(stop))
    ticks = 0
    for _ in range(20):  # the caller's loop keeps running beside it
        await asyncio.sleep(0.01)
        ticks += 1
    assert ticks == 20 and not runner.done()
    stop.set()
    summary = await asyncio.wait_for(runner, 30)
    assert summary.empty
