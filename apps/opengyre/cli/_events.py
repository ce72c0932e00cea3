"""`opengyre events tail` and `opengyre events show`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Annotated

import typer
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from opengyre.console import DataDirOpt, NatsUrlOpt, console, fail, log_session, settings_from

from ..eventlog import StoredEvent

__all__ = ["register"]


def _summary(s: StoredEvent, width: int = 90) -> str:
    if s.unreadable:  # its body went out of band and that blob is missing or corrupt
        return f"[red]<unreadable: {escape(s.unreadable_detail)}>[/]"
    try:
        body = json.loads(s.body)
    except ValueError:
        return f"<undecodable {len(s.body)} bytes>"
    if isinstance(body, dict):
        for k in ("type", "event_id", "occurred_at", "correlation_id", "causation_id"):
            body.pop(k, None)
        text = " ".join(f"{k}={json.dumps(v)}" for k, v in body.items() if v not in (None, [], {}, ""))
    else:
        text = json.dumps(body)
    return text if len(text) <= width else text[: width - 1] + "…"


def _row_table() -> Table:
    t = Table(show_edge=False)
    for col in ("seq", "time", "type", "subject", "fields"):
        t.add_column(col, overflow="fold" if col == "fields" else "ellipsis")
    return t


def _add(t: Table, s: StoredEvent) -> None:
    when = s.time.strftime("%H:%M:%S.%f")[:-3] if s.time else ""
    t.add_row(str(s.seq), when, s.type_name or "[red]?[/]", s.subject, _summary(s))


def tail(
    n: Annotated[int, typer.Option("-n", help="How many of the latest events")] = 20,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new events")] = False,
    event_type: Annotated[str | None, typer.Option("--type", help="Only this event type")] = None,
    aggregate: Annotated[str | None, typer.Option(help="Only this aggregate (execution, cell, task, ...)")] = None,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
) -> None:
    """Print the latest events of the log."""
    if n < 0:
        raise fail("-n must be >= 0")
    settings = settings_from(data_dir, nats_url)

    async def main() -> None:
        async with log_session(settings) as log:
            subjects = [log.config.aggregate_filter(aggregate)] if aggregate else None
            last = await log.last_seq()
            start = max(1, last - n + 1) if not event_type else 1
            picked: list[StoredEvent] = []
            async for s in log.read(start, last, subjects=subjects):
                if event_type is None or s.type_name == event_type:
                    picked.append(s)
            t = _row_table()
            for s in picked[-n:] if n else []:
                _add(t, s)
            console.print(t)
            while follow:
                await asyncio.sleep(0.5)
                now = await log.last_seq()
                if now > last:
                    t = _row_table()
                    async for s in log.read(last + 1, now, subjects=subjects):
                        if event_type is None or s.type_name == event_type:
                            _add(t, s)
                    last = now
                    if t.row_count:
                        console.print(t)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


def show(
    seq: Annotated[int, typer.Argument(help="Stream sequence of the event")],
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
) -> None:
    """Print one event whole, with its headers and decoded form."""
    if seq < 1:
        raise fail("sequence numbers start at 1")
    settings = settings_from(data_dir, nats_url)

    async def main() -> None:
        async with log_session(settings) as log:
            try:
                s = await log.get(seq)
            except Exception as exc:
                raise fail(f"no event at sequence {seq} ({exc})") from exc
            console.print(
                f"[bold]seq[/] {s.seq}  [bold]subject[/] {s.subject}  [bold]type[/] {s.type_name} v{s.version}"
            )
            console.print(f"[bold]event id[/] {s.event_id}")
            try:
                log.decode(s)
                status = "[green]decodes with this version of OpenGyre[/]"
            except Exception as exc:
                status = f"[red]does not decode ({getattr(exc, 'reason', 'error')}): {escape(str(exc))}[/]"
            console.print(status)
            if s.unreadable:
                console.print(f"[red]body unreadable: {escape(s.unreadable_detail)}[/]")
                return
            try:
                body = json.loads(s.body)
                text = json.dumps(body, indent=2)
            except ValueError:
                body, text = None, repr(s.body[:2000])
            if s.type_name == "execution-finished" and isinstance(body, dict):
                ran = body.get("sandbox") or "not recorded"
                note = " [yellow](no isolation: the host's files, processes and network)[/]" if ran == "none" else ""
                console.print(f"[bold]sandbox[/] {escape(str(ran))}{note}")
            console.print(Syntax(text, "json", word_wrap=True))

    asyncio.run(main())


def register(events_app: typer.Typer) -> None:
    events_app.command()(tail)
    events_app.command()(show)
