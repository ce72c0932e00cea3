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


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(_CHUNK):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


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
    """The Unix sockets of one sandbox, each relayed to its endpoint; ``close()`` ends them and their streams."""

    def __init__(self) -> None:
        self._loop = _Loop.get()
        self._servers: list[asyncio.AbstractServer] = []
        self._tasks: set[asyncio.Task[None]] = set()

    def serve(self, path: Path, endpoint: Endpoint) -> None:
        fut: Future[asyncio.AbstractServer] = asyncio.run_coroutine_threadsafe(self._start(path, endpoint), self._loop)
        self._servers.append(fut.result(30))

    async def _start(self, path: Path, endpoint: Endpoint) -> asyncio.AbstractServer:
        async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
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
            await asyncio.gather(_pump(r, uw), _pump(ur, w))
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
