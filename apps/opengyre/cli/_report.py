"""`opengyre report`: a run's summary tables and HTML report from the event log, or a live dashboard of it."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Annotated

import typer
from nats.js.errors import NotFoundError

from opengyre.console import DataDirOpt, NatsUrlOpt, StreamOpt, console, fail, log_session, settings_from

from ..eventlog import EventLog
from ..report import LiveDashboard, RunSummary, summarize, summary_table

__all__ = ["register"]


async def _last_seq(log: EventLog) -> int:
    try:
        return await log.last_seq()
    except NotFoundError as exc:
        raise fail(f"no event stream {log.config.stream!r} on this server: nothing has been logged there") from exc


async def _follow(log: EventLog, start_seq: int) -> RunSummary:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError):  # not on every platform; Ctrl-C then ends the run as usual
        loop.add_signal_handler(signal.SIGINT, stop.set)
        loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        return await LiveDashboard(log, start_seq=start_seq, console=console).run(stop)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)
            loop.remove_signal_handler(signal.SIGTERM)


def report(
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Write the HTML report (plots and tables) here")
    ] = None,
    since_seq: Annotated[int, typer.Option("--since-seq", help="First event of the run (stream sequence)")] = 1,
    until_seq: Annotated[
        int | None, typer.Option("--until-seq", help="Last event of the run [default: the log's end now]")
    ] = None,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Show a live dashboard until Ctrl-C, then the report")
    ] = False,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    stream: StreamOpt = None,
) -> None:
    """A run as its event log tells it: rewards per step, cells and their roles, the watermark, executions,
    task difficulty per round, hardening, where time went; as tables, an HTML report (--out), or live (--follow)."""
    if since_seq < 1:
        raise fail("--since-seq starts at 1")
    if until_seq is not None and until_seq < since_seq:
        raise fail(f"--until-seq {until_seq} is before --since-seq {since_seq}")
    if follow and until_seq is not None:
        raise fail("--follow reads to the end of the log as it grows: it takes no --until-seq")
    settings = settings_from(data_dir, nats_url, stream=stream)

    async def main() -> RunSummary:
        async with log_session(settings) as log:
            last = await _last_seq(log)
            if follow:
                return await _follow(log, since_seq)
            if last < since_seq:
                raise fail(
                    f"the event log {log.config.stream!r} ends at seq {last}: nothing from seq {since_seq} on"
                    if last
                    else f"the event log {log.config.stream!r} is empty: run something first (`opengyre demo`)"
                )
            return await summarize(log, start_seq=since_seq, end_seq=until_seq)

    summary = asyncio.run(main())
    if summary.empty:
        raise fail(
            f"no run events (skills, tasks, executions, cells, training) in seq {since_seq}..{until_seq or 'end'}"
        )
    console.print(summary_table(summary))
    if out is not None:
        from ..report import write_html  # matplotlib: only when a report is written

        path = write_html(summary, out)
        console.print(f"[green]report written to {path}[/]")


def register(app: typer.Typer) -> None:
    app.command()(report)
