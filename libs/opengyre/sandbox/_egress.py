"""The host side of a sandbox's egress: a Unix socket per allowed endpoint, relayed to that loopback TCP address.

The namespace sandbox has only a loopback interface; the sockets are bound into it, and the launcher inside
(``_egress_in.py``) listens on the same ``127.0.0.1:port`` there and forwards each connection to its socket. So
an execution's base URL works unchanged inside and nothing else of the host's network is reachable. One asyncio
loop in a daemon thread relays for every sandbox of this process; bytes are forwarded as they come (a streamed
response, SSE, passes through unbuffered), and each direction's end is passed on (half-close) before both close.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from concurrent.futures import Future
from pathlib import Path

__all__ = ["EgressRelay", "Endpoint", "parse_endpoint"]

Endpoint = tuple[str, int]
_CHUNK = 1 << 16


def parse_endpoint(spec: str) -> Endpoint:
    """``"127.0.0.1:8080"`` -> ("127.0.0.1", 8080). Only IPv4 loopback addresses: the sandbox's own loopback
    answers there, and no traffic may leave the machine."""
    host, sep, port_text = spec.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"egress endpoint {spec!r} is not host:port")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"egress endpoint {spec!r}: the host must be a loopback IPv4 address") from None
    if addr.version != 4 or not addr.is_loopback:
        raise ValueError(f"egress endpoint {spec!r}: only loopback IPv4 addresses may be reached")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"egress endpoint {spec!r}: port out of range")
    return str(addr), port


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, source: asyncio.StreamWriter) -> None:
    """``reader`` to ``writer``; its end is passed on, and a reset (either side) ends both connections at once —
    otherwise the other direction would wait on a peer that will never send (``source`` is ``reader``'s own)."""
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()
        source.transport.abort()


class _Loop:
    """The relay's event loop, in a daemon thread started on first use."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="sandbox-egress", daemon=True).start()
                cls._loop = loop
            return cls._loop


class EgressRelay:
    """The Unix sockets of one sandbox, each relayed to its endpoint; ``close()`` ends them and their streams.

    At most ``max_connections`` of the sandbox's connections are relayed at a time (None: no bound); one past it
    is closed at once, before anything is opened towards the endpoint. Each relayed connection holds two
    descriptors of this process (which serves every sandbox of it) and one of the endpoint's: without a bound a
    sandbox connecting in a loop to its socket would exhaust them, and every other execution's egress, the
    service's own files and the proxy's connections with them."""

    def __init__(self, max_connections: int | None = None) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        self._loop = _Loop.get()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._max = max_connections
        self.refused = 0  # connections closed at the bound

    def serve(self, path: Path, endpoint: Endpoint) -> None:
        fut: Future[asyncio.AbstractServer] = asyncio.run_coroutine_threadsafe(self._start(path, endpoint), self._loop)
        self._servers.append(fut.result(30))

    async def _start(self, path: Path, endpoint: Endpoint) -> asyncio.AbstractServer:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            if self._max is not None and len(self._tasks) >= self._max:
                self.refused += 1
                w.close()  # seen inside as a connection closed by the peer, as a refused one
                return
            self._tasks.add(task)  # type: ignore[arg-type]
            try:
                await self._relay(r, w, endpoint)
            finally:
                self._tasks.discard(task)  # type: ignore[arg-type]

        return await asyncio.start_unix_server(handle, path=str(path))

    async def _relay(self, r: asyncio.StreamReader, w: asyncio.StreamWriter, endpoint: Endpoint) -> None:
        try:
            ur, uw = await asyncio.open_connection(*endpoint)
        except OSError:
            w.close()  # the endpoint is down: the sandbox's side sees a closed connection, as a refused one
            return
        try:
            await asyncio.gather(_pump(r, uw, w), _pump(ur, w, uw))
        finally:
            for writer in (w, uw):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    def close(self) -> None:
        async def stop() -> None:
            for server in self._servers:
                server.close()
            for task in list(self._tasks):
                task.cancel()
            for server in self._servers:
                await server.wait_closed()

        if self._servers:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(30)
        self._servers = []
