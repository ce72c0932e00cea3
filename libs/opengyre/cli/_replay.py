"""`opengyre replay` (a projection as of any point of the log) and `opengyre projections`."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from ..config import Settings
from ..eventlog import EventLog
from ..projection import FoldTransaction, Projection, ProjectionRunner, dump_rows, rebuild, replay_into
from ..runtime import all_projections, stack_alive
from ..store import create_db_engine, migrate
from ._common import DataDirOpt, DbUrlOpt, NatsUrlOpt, console, fail, log_session, settings_from

__all__ = ["register", "replay_compare"]


def _projection(name: str) -> Projection:
    known = all_projections()
    if name not in known:
        raise fail(f"unknown projection {name!r}; known: {', '.join(sorted(known))}")
    return known[name]


async def replay_compare(
    projection: Projection, log: EventLog, settings: Settings, until_seq: int | None
) -> tuple[dict[str, list[tuple[Any, ...]]], bool | None, int]:
    """Replay into a fresh store; compare with the live rows when replaying to the live position."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_db_engine(f"sqlite:///{Path(tmp) / 'replay.db'}")
        try:
            await asyncio.to_thread(migrate, engine)
            n = await replay_into(projection, log, engine, until_seq=until_seq)
            rows = dump_rows(engine, projection.tables)
        finally:
            engine.dispose()
    live_engine = create_db_engine(settings.database_url)
    try:
        position = await asyncio.to_thread(FoldTransaction(projection, live_engine, log.registry).position)
        same: bool | None = None
        if until_seq is None or until_seq >= position:
            same = _canonical(dump_rows(live_engine, projection.tables)) == _canonical(rows)
    finally:
        live_engine.dispose()
    return rows, same, n


def _canonical(rows: dict[str, list[tuple[Any, ...]]]) -> dict[str, list[tuple[Any, ...]]]:
    """Rows in a dialect-neutral form: the scratch replay is SQLite, the live store may be PostgreSQL, which
    hands back timezone-aware datetimes (SQLite: naive UTC) and may order text keys by another collation."""

    def value(v: Any) -> Any:
        if isinstance(v, datetime):
            return (v if v.tzinfo is None else v.astimezone(UTC).replace(tzinfo=None)).isoformat()
        if isinstance(v, memoryview):
            return bytes(v)
        return v

    return {name: sorted((tuple(value(v) for v in r) for r in data), key=repr) for name, data in rows.items()}


def _print_rows(projection: Projection, rows: dict[str, list[tuple[Any, ...]]], limit: int) -> None:
    for table in projection.tables:
        data = rows[table.name]
        t = Table(title=f"{table.name} ({len(data)} rows)", show_edge=False)
        for col in table.columns:
            t.add_column(col.name, overflow="ellipsis", max_width=24)
        for r in data[:limit]:
            t.add_row(*("" if v is None else str(v) for v in r))
        console.print(t)
        if len(data) > limit:
            console.print(f"[dim]... {len(data) - limit} more rows (--limit)[/]")


def replay(
    projection: Annotated[str, typer.Option("--projection", "-p", help="Projection to rebuild")],
    until_seq: Annotated[int | None, typer.Option("--until-seq", help="Stop at this stream sequence")] = None,
    limit: Annotated[int, typer.Option(help="Rows shown per table")] = 20,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Rebuild a projection from the log as of any point, into a scratch store, and show it.

    Replaying to the live position also compares the rows with the live projection.
    """
    if until_seq is not None and until_seq < 0:
        raise fail("--until-seq must be >= 0")
    settings = settings_from(data_dir, nats_url, db_url)
    proj = _projection(projection)

    async def main() -> None:
        async with log_session(settings) as log:
            rows, same, n = await replay_compare(proj, log, settings, until_seq)
        where = f"up to seq {until_seq}" if until_seq is not None else "to the end of the log"
        console.print(f"replayed [bold]{proj.name}[/] {where}: {n} events")
        _print_rows(proj, rows, limit)
        if same is True:
            console.print("[green]✓ the replay matches the live projection row for row[/]")
        elif same is False:
            console.print("[red]✗ the replay differs from the live projection[/]")
            raise typer.Exit(1)

    asyncio.run(main())


def list_projections(data_dir: DataDirOpt = None, nats_url: NatsUrlOpt = None, db_url: DbUrlOpt = None) -> None:
    """Every projection with its position, lag and dead letters, and why it refuses the log's stream if it does."""
    settings = settings_from(data_dir, nats_url, db_url)

    async def main() -> None:
        engine = create_db_engine(settings.database_url)
        async with log_session(settings) as log:
            await asyncio.to_thread(migrate, engine)
            t = Table()
            for col in ("projection", "position", "stream last", "pending", "tracked", "dead letters", "state"):
                t.add_column(col)
            refusing: list[str] = []
            for proj in all_projections().values():
                runner = ProjectionRunner(proj, log, engine)
                try:
                    st = await runner.status()
                    t.add_row(
                        proj.name,
                        str(st.position),
                        str(st.stream_last_seq),
                        str(st.pending),
                        str(st.tracked),
                        str(st.dead_letters),
                        "[red]REFUSES THE STREAM[/]" if st.error else "folding",
                    )
                    if st.error:
                        refusing.append(st.error)
                except Exception:
                    pos = await asyncio.to_thread(FoldTransaction(proj, engine, log.registry).position)
                    t.add_row(proj.name, str(pos), str(await log.last_seq()), "no consumer", "", "", "")
            console.print(t)
        engine.dispose()
        for why in refusing:
            console.print(f"[bold red]error:[/] {escape(why)}")
        if refusing:
            raise typer.Exit(1)

    asyncio.run(main())


def rebuild_cmd(
    projection: Annotated[str, typer.Argument(help="Projection to rebuild in place")],
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Drop a projection's rows and rebuild them from sequence 1 (stop the stack first)."""
    settings = settings_from(data_dir, nats_url, db_url)
    if stack_alive(settings):
        raise fail("the stack is running and owns its projections: `opengyre down` first")
    proj = _projection(projection)

    async def main() -> None:
        engine = create_db_engine(settings.database_url)
        async with log_session(settings) as log:
            await asyncio.to_thread(migrate, engine)
            n = await rebuild(proj, log, engine)
            console.print(f"rebuilt {proj.name} from {n} events")
        engine.dispose()

    asyncio.run(main())


def register(app: typer.Typer, projections_app: typer.Typer) -> None:
    app.command()(replay)
    projections_app.command("list")(list_projections)
    projections_app.command("rebuild")(rebuild_cmd)
