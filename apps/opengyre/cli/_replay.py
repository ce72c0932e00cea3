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

from opengyre.console import DataDirOpt, DbUrlOpt, NatsUrlOpt, StreamOpt, console, fail, log_session, settings_from

from ..config import Settings
from ..eventlog import EventLog
from ..projection import FoldTransaction, Projection, ProjectionRunner, dump_rows, rebuild, replay_into
from ..runtime import DataDirBusy, DataDirLock, DataDirUnusable, all_projections, projection_owners
from ..store import create_db_engine, migrate

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
    rows, diffs, n = await _replay_diff(projection, log, settings, until_seq)
    return rows, None if diffs is None else not diffs, n


async def _replay_diff(
    projection: Projection, log: EventLog, settings: Settings, until_seq: int | None
) -> tuple[dict[str, list[tuple[Any, ...]]], list[str] | None, int]:
    """The replayed rows, a line per table where they differ from the live rows (None: an earlier point, not
    compared), and the events replayed."""
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_db_engine(f"sqlite:///{Path(tmp) / 'replay.db'}")
        try:
            await asyncio.to_thread(migrate, engine)
            n = await replay_into(projection, log, engine, until_seq=until_seq)
            rows = dump_rows(engine, projection.tables)
        finally:
            engine.dispose()
    live_engine = create_db_engine(_store_of(projection, settings))
    try:
        position = await asyncio.to_thread(FoldTransaction(projection, live_engine, log.registry).position)
        diffs: list[str] | None = None
        if until_seq is None or until_seq >= position:
            diffs = _differences(_canonical(dump_rows(live_engine, projection.tables)), _canonical(rows))
    finally:
        live_engine.dispose()
    return rows, diffs, n


def _differences(live: dict[str, list[tuple[Any, ...]]], replayed: dict[str, list[tuple[Any, ...]]]) -> list[str]:
    """One line per table whose rows differ, with the first row on each side that the other lacks."""
    out: list[str] = []
    for table in sorted(set(live) | set(replayed)):
        a, b = live.get(table, []), replayed.get(table, [])
        if a == b:
            continue
        only_live = [r for r in a if r not in b]
        only_replay = [r for r in b if r not in a]
        line = f"{table}: {len(only_live)} row(s) only live, {len(only_replay)} only in the replay"
        if only_live:
            line += f"; live {only_live[0]!r}"
        if only_replay:
            line += f"; replay {only_replay[0]!r}"
        out.append(line)
    return out


def _store_of(projection: Projection, settings: Settings) -> str:
    """The store of the service that owns the projection (each service keeps its own)."""
    owner, _ = projection_owners()[projection.name]
    return settings.store_url(owner)


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
    stream: StreamOpt = None,
) -> None:
    """Rebuild a projection from the log as of any point, into a scratch store, and show it.

    Replaying to the live position also compares the rows with the live projection (the store and stream the
    data dir's stack recorded, unless given).
    """
    if until_seq is not None and until_seq < 0:
        raise fail("--until-seq must be >= 0")
    settings = settings_from(data_dir, nats_url, db_url, stream)
    proj = _projection(projection)
    _need_store(settings)

    async def main() -> None:
        async with log_session(settings) as log:
            rows, diffs, n = await _replay_diff(proj, log, settings, until_seq)
        where = f"up to seq {until_seq}" if until_seq is not None else "to the end of the log"
        console.print(f"replayed [bold]{proj.name}[/] {where}: {n} events")
        _print_rows(proj, rows, limit)
        if diffs is None:
            return
        if not diffs:
            console.print("[green]✓ the replay matches the live projection row for row[/]")
            return
        console.print(f"[red]✗ the replay differs from the live projection {escape(proj.name)}[/]")
        for line in diffs:
            console.print(f"  [red]{escape(line)}[/]", soft_wrap=True)
        raise typer.Exit(1)

    asyncio.run(main())


def _need_store(settings: Settings) -> None:
    """A clear error for a data dir with no projection store (nothing ever ran there)."""
    if settings.db_url:
        return
    if not (settings.data_dir / "db").is_dir():
        raise fail(f"no projection store in {settings.data_dir}: start a stack with `opengyre up` or pass --db-url")


def list_projections(
    data_dir: DataDirOpt = None, nats_url: NatsUrlOpt = None, db_url: DbUrlOpt = None, stream: StreamOpt = None
) -> None:
    """Every projection with its position, lag and dead letters, and why it refuses the log's stream if it does."""
    settings = settings_from(data_dir, nats_url, db_url, stream)
    _need_store(settings)

    async def main() -> None:
        engines = {url: create_db_engine(url) for url in set(settings.store_urls().values())}
        async with log_session(settings) as log:
            for engine in engines.values():
                await asyncio.to_thread(migrate, engine)
            t = Table()
            for col in (
                "projection",
                "service",
                "position",
                "stream last",
                "pending",
                "tracked",
                "dead letters",
                "state",
            ):
                t.add_column(col)
            refusing: list[str] = []
            for name, (owner, proj) in projection_owners().items():
                engine = engines[settings.store_url(owner)]
                runner = ProjectionRunner(proj, log, engine)
                try:
                    st = await runner.status()
                    t.add_row(
                        name,
                        owner,
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
                    t.add_row(name, owner, str(pos), str(await log.last_seq()), "no consumer", "", "", "")
            console.print(t)
        for engine in engines.values():
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
    stream: StreamOpt = None,
) -> None:
    """Drop a projection's rows and rebuild them from sequence 1 (stop the stack first)."""
    settings = settings_from(data_dir, nats_url, db_url, stream)
    proj = _projection(projection)
    # Holding the data dir: no stack (whose service owns the projection) starts meanwhile.
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire("rebuild", f"opengyre projections rebuild {proj.name}")
    except (DataDirBusy, DataDirUnusable) as exc:
        raise fail(f"{exc} (the stack owns its projections: `opengyre down` first)") from exc
    settings.ensure_store_dir()

    async def main() -> None:
        engine = create_db_engine(_store_of(proj, settings))
        async with log_session(settings, held=lock) as log:
            await asyncio.to_thread(migrate, engine)
            n = await rebuild(proj, log, engine)
            console.print(f"rebuilt {proj.name} from {n} events")
        engine.dispose()

    try:
        asyncio.run(main())
    finally:
        lock.release()


def register(app: typer.Typer, projections_app: typer.Typer) -> None:
    app.command()(replay)
    projections_app.command("list")(list_projections)
    projections_app.command("rebuild")(rebuild_cmd)
