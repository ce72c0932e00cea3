"""Options and helpers shared by CLI commands."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from ..config import Settings
from ..eventlog import EventLog, LogUnavailable

__all__ = ["DataDirOpt", "DbUrlOpt", "NatsUrlOpt", "console", "fail", "log_session", "settings_from"]

console = Console()

DataDirOpt = Annotated[
    Path | None, typer.Option("--data-dir", help="Where the embedded stack keeps its state [default: ./.opengyre]")
]
NatsUrlOpt = Annotated[
    str | None, typer.Option("--nats-url", help="Join this NATS JetStream instead of starting the embedded one")
]
DbUrlOpt = Annotated[
    str | None, typer.Option("--db-url", help="SQLAlchemy URL of the projection store [default: SQLite in data dir]")
]


def settings_from(data_dir: Path | None, nats_url: str | None = None, db_url: str | None = None) -> Settings:
    return Settings.from_env(data_dir=data_dir, nats_url=nats_url, db_url=db_url)


def fail(message: str, code: int = 2) -> typer.Exit:
    console.print(f"[bold red]error:[/] {message}")
    return typer.Exit(code)


@contextlib.asynccontextmanager
async def log_session(settings: Settings) -> AsyncIterator[EventLog]:
    """The event log of --nats-url or of the running stack; with the stack down, the data dir's own log
    served by a temporary embedded nats-server. Fails with a clear message otherwise."""
    from ..runtime import EmbeddedNats, stack_alive

    running = stack_alive(settings)
    url = settings.nats_url or (running["nats_url"] if running else None)
    server: EmbeddedNats | None = None
    if not url:
        store = settings.data_dir / "nats"
        if not store.is_dir():
            raise fail(f"no event log in {settings.data_dir}: start a stack with `opengyre up` or pass --nats-url")
        server = EmbeddedNats(store, host=settings.host)
        url = await asyncio.to_thread(server.start)
    try:
        try:
            log = await EventLog.connect(url, settings.log, create=False)
        except LogUnavailable as exc:
            raise fail(f"{exc}. Is the stack up? (`opengyre up`)") from exc
        try:
            yield log
        finally:
            await log.close()
    finally:
        if server is not None:
            server.stop()
