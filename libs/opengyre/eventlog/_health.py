"""Whether the log can take appends now: the client's connection, and the server's own health report.

A nats-server whose store failed a write (a full disk) stays connected and answers JetStream API calls, but
never acknowledges a publish to that stream again until it restarts; only its monitoring endpoint
(``/healthz``) says so. A client that knows that endpoint can turn a bare timeout into the reason.
"""

from __future__ import annotations

import asyncio
import logging
from typing import NamedTuple

import httpx

__all__ = ["FULL_MARGIN_BYTES", "ConnectionWatch", "HealthProbe", "LogHealth", "StreamUsage", "server_health"]

log = logging.getLogger("opengyre.eventlog")


class LogHealth(NamedTuple):
    ok: bool
    reason: str  # why not, in words a user can act on ("" when ok)
    # The store failed a write (a full disk): it stays failed until nats-server restarts, unlike a stream that is
    # catching up or electing a leader, which heals by itself.
    store_failed: bool = False


# A stream with less room than this left refuses the next append of any event we write (each stored message
# counts its subject and headers too, so even a small event needs a few hundred bytes): "full".
FULL_MARGIN_BYTES = 1024


class StreamUsage(NamedTuple):
    """How much of its byte limit a stream holds, as the server counts it (``max_bytes`` -1: no limit)."""

    stream: str
    bytes: int
    messages: int
    max_bytes: int
    compression: str = "none"  # how its blocks are stored on disk (the bytes counted here are uncompressed)

    @property
    def full(self) -> bool:
        """Appends are refused (discard "new"): less than ``FULL_MARGIN_BYTES`` of room left."""
        return self.max_bytes > 0 and self.max_bytes - self.bytes < FULL_MARGIN_BYTES

    def describe(self) -> str:
        stored = f", blocks stored {self.compression}-compressed" if self.compression != "none" else ""
        if self.max_bytes <= 0:
            return f"{_mib(self.bytes)} in {self.messages} events, no byte limit{stored}"
        pct = 100.0 * self.bytes / self.max_bytes
        return f"{_mib(self.bytes)} of {_mib(self.max_bytes)} ({pct:.0f}%) in {self.messages} events{stored}"


def _mib(n: int) -> str:
    return f"{n} B" if n < 2**20 else f"{n / 2**20:.1f} MiB"


class ConnectionWatch:
    """nats-py's connection callbacks, logged and turned into an event a watcher can wait on."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connected = True  # set up after the first connection succeeded
        self.closing = False
        self.changed = asyncio.Event()

    async def on_disconnected(self) -> None:
        if self.closing:  # nats-py calls this on our own close too: only a lost connection is news
            return
        log.warning("NATS: disconnected from %s; reconnecting", self.url)
        self.connected = False
        self.changed.set()

    async def on_reconnected(self) -> None:
        log.warning("NATS: reconnected to %s", self.url)
        self.connected = True
        self.changed.set()

    async def wait_changed(self, timeout: float) -> None:
        """Return on the next connection change or after ``timeout``."""
        try:
            await asyncio.wait_for(self.changed.wait(), timeout)
        except TimeoutError:
            return
        self.changed.clear()


async def server_health(
    monitor_url: str, timeout: float = 2.0, *, client: httpx.AsyncClient | None = None
) -> LogHealth:
    """nats-server's ``/healthz``: every stream and consumer of JetStream able to work. ``client``: one to
    reuse (a check that makes its own pays for an SSL context, see ``HealthProbe``)."""
    url = f"{monitor_url.rstrip('/')}/healthz"
    try:
        if client is not None:
            resp = await client.get(url, timeout=timeout)
        else:
            async with httpx.AsyncClient(timeout=timeout) as own:
                resp = await own.get(url)
    except httpx.HTTPError as exc:
        return LogHealth(False, f"nats-server monitoring at {monitor_url} does not answer ({type(exc).__name__})")
    if resp.status_code == 200:
        return LogHealth(True, "")
    try:
        body = resp.json()
    except ValueError:
        body = {}
    detail = str(body.get("error") or body.get("errors") or resp.text[:300])
    if "no space left" in detail or "write error" in detail:
        return LogHealth(False, f"the log's storage failed a write (disk full?): {detail}", store_failed=True)
    return LogHealth(False, f"nats-server reports JetStream unhealthy: {detail}")


class HealthProbe:
    """``server_health`` over one HTTP client for the log's life. A client made per check builds an SSL context
    (httpx loads the CA bundle: milliseconds of CPU) though the monitor speaks plain HTTP, and every service's
    health watch checks once a second: most of an idle service's CPU. No kept-alive connection: a nats-server
    restarted meanwhile is asked on a new one, never on a connection it closed."""

    def __init__(self, monitor_url: str) -> None:
        self.monitor_url = monitor_url
        self._client: httpx.AsyncClient | None = None

    async def check(self, timeout: float = 2.0) -> LogHealth:
        if self._client is None:
            self._client = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        return await server_health(self.monitor_url, timeout, client=self._client)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
