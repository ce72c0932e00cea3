"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from ..config import Settings, SettingsError
from ..eventlog import EventLog, LogUnavailable
from ..runtime import DataDirLock

__all__ = [
    "DataDirOpt",
    "DbUrlOpt",
    "NatsUrlOpt",
    "StreamOpt",
    "console",
    "fail",
    "log_session",
    "settings_from",
]

console = Console()

DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Where the embedded stack keeps its state [default: ./.opengyre]")
]
NatsUrlOpt = Annotated[
    str | None, typer.Option("--nats-url", help="Join this NATS JetStream instead of starting the embedded one")
]
DbUrlOpt = Annotated[
    str | None,
    typer.Option(
        "--db-url",
        help="SQLAlchemy URL of the projection store, shared by every service "
        "[default: what `opengyre up` recorded, else one SQLite file per service in <data-dir>/db]",
    ),
]
StreamOpt = Annotated[
    str | None,
    typer.Option(
        "--stream", help="JetStream stream of the events [default: what `opengyre up` recorded, else OPENGYRE]"
    ),
]


def settings_from(
    data_dir: Path | None,
    nats_url: str | None = None,
    db_url: str | None = None,
    stream: str | None = None,
    host: str | None = None,
) -> Settings:
    """Options, then the environment, then what the data dir's last `opengyre up` recorded, then defaults."""
    try:
        return Settings.from_env(data_dir=data_dir, nats_url=nats_url, db_url=db_url, stream=stream, host=host)
    except SettingsError as exc:
        raise fail(str(exc)) from exc


def fail(message: str, code: int = 2) -> typer.Exit:
    """The message printed as text, never as Rich markup: ``[task] name`` in a task's error must stay visible."""
    console.print(f"[bold red]error:[/] {escape(message)}")
    return typer.Exit(code)


@contextlib.asynccontextmanager
async def log_session(settings: Settings, *, held: DataDirLock | None = None) -> AsyncIterator[EventLog]:
    """The event log of --nats-url or of the running stack; with the stack down, the data dir's own log
    served by a temporary embedded nats-server (holding the data dir's lock meanwhile, so no stack starts on
    the same store; ``held``: the caller holds it already). Fails with a clear message otherwise."""
    from ..runtime import (
        DataDirBusy,
        DataDirUnusable,
        EmbeddedNats,
        client_credentials,
        find_leftovers,
        stack_alive,
        write_nats_config,
    )

    running = stack_alive(settings)
    url = settings.nats_url or (running["nats_url"] if running else None)
    health_url = running.get("nats_monitor_url") if running and not settings.nats_url else None
    embedded = bool(running and running.get("embedded_nats")) and not settings.nats_url
    server: EmbeddedNats | None = None
    lock: DataDirLock | None = None
    if not url:
        store = settings.data_dir / "nats"
        if not store.is_dir():
            raise fail(f"no event log in {settings.data_dir}: start a stack with `opengyre up` or pass --nats-url")
        if held is None:
            lock = DataDirLock(settings.data_dir)
            try:
                lock.acquire("log")
            except (DataDirBusy, DataDirUnusable) as exc:
                raise fail(str(exc)) from exc
        left = find_leftovers(settings)
        if left:
            if lock is not None:
                lock.release()
            raise fail(
                f"a stack that died left {', '.join(map(str, left))} running on {settings.data_dir}: "
                "`opengyre down` stops them"
            )
        # The stack's own users and permissions: the store is no more open with the stack down than up.
        server = EmbeddedNats(store, config_file=write_nats_config(settings.data_dir, settings.log))
        embedded = True
        server.launch()
        url = await asyncio.to_thread(server.wait_ready)
        health_url = server.monitor_url
    try:
        try:
            try:
                creds = client_credentials(settings.data_dir, embedded=embedded)
            except (ValueError, RuntimeError) as exc:  # the env names half a user, a credentials file is unreadable
                raise fail(str(exc)) from exc
            log = await EventLog.connect(url, settings.log, create=False, health_url=health_url, credentials=creds)
        except LogUnavailable as exc:
            raise fail(f"{exc}. Is the stack up? (`opengyre up`)") from exc
        try:
            yield log
        finally:
            await log.close()
    finally:
        if server is not None:
            server.stop()
        if lock is not None:
            lock.release()
