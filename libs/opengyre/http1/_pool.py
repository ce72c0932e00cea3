"""A lean HTTP/1.1 client: keep-alive connections, one write per request.

Written for the proxy -> engine hop, which sits on every model call: a general-purpose client spends more time
per request than the gateway's own work (measured: ~2 ms under httpx vs ~0.3 ms here). svc-bench's load
generator uses it for the same reason: the client must never be what limits a benchmark. It speaks just what
SGLang's (uvicorn), vLLM's and our engine's servers answer with: Content-Length or chunked bodies, keep-alive
unless ``connection: close``.

Kept-alive connections go stale: the server closes one that stayed idle past its keep-alive (uvicorn's
``timeout_keep_alive``: 5 s for SGLang and vLLM). A pooled connection is reused only if it was idle less than
``idle_timeout`` and the server has not closed it (no end-of-file or error seen on it); one the server closes
just as a request goes out is retried once on a *new* connection, never on another pooled one (it has been
idle as long). Every read waits at most ``read_timeout``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar
from urllib.parse import urlsplit

T = TypeVar("T")

__all__ = ["Http1ConnectError", "Http1Error", "Http1Pool", "Http1Response", "Http1TimeoutError"]


class Http1Error(Exception):
    """The connection failed or the server's answer was not HTTP/1.1 we understand."""


class Http1ConnectError(Http1Error):
    """No connection to the server could be opened (refused, unresolvable, or the connect timed out)."""


class Http1TimeoutError(Http1Error):
    """The server sent nothing for ``read_timeout`` seconds (a stalled server)."""


def _error(exc: BaseException, read_timeout: float) -> Http1Error:
    cls = Http1TimeoutError if isinstance(exc, TimeoutError) else Http1Error
    return cls(_describe(exc, read_timeout))


class _Conn:
    __slots__ = ("idle_since", "reader", "reused", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.reused = False
        self.idle_since = 0.0

    def reusable(self, now: float, idle_timeout: float) -> bool:
        """Idle for less than ``idle_timeout``, and the server has not closed it (that shows as EOF or an error)."""
        return (
            now - self.idle_since < idle_timeout
            and not self.writer.is_closing()
            and not self.reader.at_eof()
            and self.reader.exception() is None
        )

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()


class Http1Response:
    def __init__(self, pool: Http1Pool, conn: _Conn, status: int, headers: dict[str, str]) -> None:
        self._pool = pool
        self._conn: _Conn | None = conn
        self.status = status
        self.headers = headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        cl = headers.get("content-length")
        self._left = int(cl) if cl is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close"

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; the connection returns to the pool once the body is complete."""
        conn = self._conn
        if conn is None:
            return
        r = conn.reader
        within = self._pool._within
        try:
            if self._chunked:
                async for data in self._dechunk(r, within):
                    yield data
            elif self._left is not None:
                while self._left > 0:
                    data = await within(r.read(min(self._left, 1 << 16)))
                    if not data:
                        raise Http1Error("the server closed the connection mid-body")
                    self._left -= len(data)
                    yield data
            else:  # no length, not chunked: the body runs to the end of the connection
                self._keep = False
                while data := await within(r.read(1 << 16)):
                    yield data
        except (OSError, asyncio.IncompleteReadError, ValueError, TimeoutError) as exc:
            self._drop()
            raise _error(exc, self._pool.read_timeout) from exc
        except BaseException:
            self._drop()  # a cancelled read leaves the connection mid-body: never reuse it
            raise
        self._finish()

    async def _dechunk(
        self, r: asyncio.StreamReader, within: Callable[[Awaitable[bytes]], Awaitable[bytes]]
    ) -> AsyncIterator[bytes]:
        """Chunked transfer decoding from bulk reads: a short streamed answer (a few small chunks that arrive
        together) costs one or two timed reads instead of two per chunk; each timed read sets up and cancels a
        timer, which was most of this client's CPU per request."""
        buf = bytearray()
        pos = 0

        async def more(eof_ok: bool = False) -> bool:
            data = await within(r.read(1 << 16))
            if not data:
                if eof_ok:
                    return False
                raise Http1Error("the server closed the connection mid-body")
            buf.extend(data)
            return True

        async def line() -> bytes | None:
            nonlocal pos
            while (nl := buf.find(b"\n", pos)) < 0:
                if not await more(eof_ok=size == 0):
                    return None
            out = bytes(buf[pos:nl]).rstrip(b"\r")
            pos = nl + 1
            return out

        size = -1
        while True:
            size_line = await line()
            assert size_line is not None  # mid-body, end of file raised above
            size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
            if size == 0:
                while await line():
                    pass  # trailers, up to the empty line (or the end of the connection)
                break
            while len(buf) < pos + size + 2:
                await more()
            yield bytes(buf[pos : pos + size])
            pos += size + 2
            if pos > 1 << 16:
                del buf[:pos]
                pos = 0
        if pos < len(buf):
            self._keep = False  # bytes past the end of the body: the connection's framing cannot be trusted

    async def read(self) -> bytes:
        return b"".join([c async for c in self.chunks()])

    async def lines(self) -> AsyncIterator[bytes]:
        """Body lines (for server-sent events), without the line ends."""
        buf = b""
        async for chunk in self.chunks():
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for line in complete:
                yield line.rstrip(b"\r")
        if buf:
            yield buf.rstrip(b"\r")

    def _finish(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            if self._keep:
                self._pool._release(conn)
            else:
                conn.close()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Give up on the rest of the body (the connection is closed, not reused)."""
        self._drop()


def _describe(exc: BaseException, read_timeout: float) -> str:
    if isinstance(exc, TimeoutError):
        return f"the server sent nothing for {read_timeout:g} s (read timeout)"
    return f"{type(exc).__name__}: {exc}"


class Http1Pool:
    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        max_idle: int = 512,
        idle_timeout: float = 4.0,
        read_timeout: float = 600.0,
    ) -> None:
        u = urlsplit(base_url)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"only http:// URLs are supported by the fast client, got {base_url!r}")
        self.host = u.hostname
        self.port = u.port or 80
        self.prefix = u.path.rstrip("/")
        self.authority = u.netloc
        self.connect_timeout = connect_timeout
        self.max_idle = max_idle
        self.idle_timeout = idle_timeout
        self.read_timeout = read_timeout
        self._idle: collections.deque[_Conn] = collections.deque()  # oldest first
        self._closed = False
        self.connects = 0  # connections opened
        self.stale = 0  # pooled connections discarded before use (idle too long, or closed by the server)
        self.retried = 0  # requests sent again on a new connection after a pooled one failed unanswered

    @property
    def idle(self) -> int:
        return len(self._idle)

    @property
    def idle_closed(self) -> int:
        """Idle connections the server has closed (end-of-file seen): the next request drops them."""
        return sum(1 for c in self._idle if c.reader.at_eof() or c.reader.exception() is not None)

    async def _within(self, aw: Awaitable[T]) -> T:
        async with asyncio.timeout(self.read_timeout):
            return await aw

    def _take_idle(self) -> _Conn | None:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()  # the most recently used: the least likely to be stale
            if conn.reusable(now, self.idle_timeout):
                return conn
            self.stale += 1
            conn.close()
        return None

    def _prune(self, now: float) -> None:
        while self._idle and not self._idle[0].reusable(now, self.idle_timeout):
            self.stale += 1
            self._idle.popleft().close()

    async def _connect(self) -> _Conn:
        try:
            r, w = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, limit=1 << 22), self.connect_timeout
            )
        except (OSError, TimeoutError) as exc:
            raise Http1ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        self.connects += 1
        return _Conn(r, w)

    def _release(self, conn: _Conn) -> None:
        conn.reused = True
        conn.idle_since = now = time.monotonic()
        self._prune(now)  # the oldest idle ones would only go stale at the bottom of the pool
        if not self._closed and len(self._idle) < self.max_idle and conn.reusable(now, self.idle_timeout):
            self._idle.append(conn)
        else:
            conn.close()

    async def close(self) -> None:
        """Close the idle connections; those still in use close when their response ends."""
        self._closed = True
        idle, self._idle = self._idle, collections.deque()
        for c in idle:
            c.close()

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> Http1Response:
        head = [f"{method} {self.prefix}{path} HTTP/1.1", f"host: {self.authority}", f"content-length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        payload = ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body
        conn = self._take_idle() or await self._connect()
        for attempt in (0, 1):
            answered = False
            try:
                conn.writer.write(payload)
                await conn.writer.drain()
                status_line = await self._within(conn.reader.readline())
                if not status_line:
                    raise ConnectionResetError("the server closed the connection before answering")
                answered = True
                raw = await self._within(conn.reader.readuntil(b"\r\n\r\n"))
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError) as exc:
                conn.close()
                # A kept-alive connection the server closed as the request went out (nothing came back): once
                # more on a new connection. Not on another pooled one: it has been idle as long as this one.
                if conn.reused and attempt == 0 and not answered and not isinstance(exc, TimeoutError):
                    self.retried += 1
                    conn = await self._connect()
                    continue
                raise _error(exc, self.read_timeout) from exc
            except BaseException:
                conn.close()
                raise
            parts = status_line.split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
                conn.close()
                raise Http1Error(f"not an HTTP/1.1 response: {status_line[:80]!r}")
            headers_out: dict[str, str] = {}
            for line in raw.split(b"\r\n"):
                if b":" in line:
                    k, v = line.split(b":", 1)
                    headers_out[k.strip().lower().decode("latin-1")] = v.strip().decode("latin-1")
            return Http1Response(self, conn, int(parts[1]), headers_out)
        raise Http1Error("unreachable")
