"""Connecting to NATS: fail fast on a wrong URL or refused credentials, then reconnect for ever."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import nats.errors
from nats.aio.client import Client

from ._auth import NatsCredentials
from ._client import FastHeaderClient
from ._errors import LogUnavailable
from ._health import ConnectionWatch
from ._server import require_server_version

__all__ = ["open_connection"]

log = logging.getLogger(__name__)


async def _log_error(exc: Exception) -> None:
    log.warning("NATS: %s: %s", type(exc).__name__, exc)


def _server_version(nc: Client) -> str:
    """The connected server's version as ``major.minor.patch`` ("unknown" if it sent none that parses)."""
    try:
        v = nc.connected_server_version
        return f"{v.major}.{v.minor}.{v.patch}"
    except (ValueError, TypeError):
        return "unknown"


async def open_connection(
    url: str, *, timeout: float, credentials: NatsCredentials | None
) -> tuple[Client, ConnectionWatch]:
    """A connected client to a server of a version we support, and the watch of its connection state."""
    nc = FastHeaderClient()
    watch = ConnectionWatch(url)
    # A server that refuses the credentials: nats-py would retry them until the timeout; say so at once.
    refusal: list[Exception] = []
    refused = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower():
            refusal.append(exc)
            refused.set()
        await _log_error(exc)

    connecting = asyncio.ensure_future(
        nc.connect(
            # "nats://a:4222,nats://b:4222": the seeds of a cluster (the client learns the others from them)
            [u.strip() for u in url.split(",") if u.strip()],
            connect_timeout=max(1, int(timeout)),
            # Reconnect forever once connected (a restarted server or a network blip must not end a service),
            # but bound the first connection so a wrong URL fails fast.
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            reconnect_time_wait=1,
            error_cb=on_error,
            disconnected_cb=watch.on_disconnected,
            reconnected_cb=watch.on_reconnected,
            **(credentials.connect_options() if credentials is not None else {}),
        )
    )
    waiting = asyncio.ensure_future(refused.wait())
    try:
        await asyncio.wait({connecting, waiting}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await connecting
            raise refusal[0] if refusal else TimeoutError()
        connecting.result()
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        with contextlib.suppress(Exception):
            await nc.close()
        if refusal or isinstance(exc, nats.errors.AuthorizationError):
            who = f"as {credentials!r}" if credentials is not None else "without credentials"
            raise LogUnavailable(f"the NATS server at {url} refuses a connection {who}: {exc}") from exc
        raise LogUnavailable(f"no NATS server answers at {url} ({type(exc).__name__}: {exc or 'timed out'})") from exc
    finally:
        waiting.cancel()
    try:
        require_server_version(_server_version(nc), url)
    except LogUnavailable:
        await nc.close()
        raise
    return nc, watch
