"""uvicorn's httptools protocol with the bounds it lacks (issue 24 item 5; the limits: ``opengyre.config.HttpLimits``).

uvicorn bounds neither a request head (httptools buffers a header of any size: a 128 MiB header was answered 200)
nor the time a client takes to send it (its keep-alive timer stops at a request's first byte, so a slowloris
connection is held for ever), nor a body, nor connections per client. h11 bounds the head (16 KiB) but answers
400, and costs more per request (docs/benchmarks.md). So this keeps the C parser and adds, per connection:

- the head's bytes, counted on the raw bytes before the parser sees them (so nothing over the limit is ever
  buffered), and its header count, counted as the parser reports them: over either, 431;
- a head deadline from the accept (or from the request's first byte on a kept-alive connection): 408;
- the body's declared length (413 before reading it) or its running length (413 as soon as it passes);
- the longest silence mid-body (408), not counted while the app has not read what came (flow control paused);
- connections per client address and in all: over either, 503 with Retry-After at once;
- a write deadline: a response whose client stops reading it fills the socket's buffers, uvicorn then waits for
  them to drain before each send (so what the server holds is bounded: the transport's 64 KiB high-water mark and
  one send), but for ever. Once writes have been paused for ``write_timeout_s`` the connection is aborted, counted
  (``write_timeout``) and logged; the app sees its client leave (a stream is cancelled, its engine slot freed).

A refusal is written, the write side shut, what still comes discarded for at most ``LINGER_S`` and then the
socket closed: closing with unread bytes would reset the connection and the client could lose the answer (a
client still sending a 40 MiB body reads its 413). A pipelined request's head is counted from the socket read
after the one that ended the request before it (at most one read, 256 KiB, uncounted).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import httptools
import msgspec
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from opengyre.config import HttpLimits

__all__ = ["LINGER_S", "ConnectionGuard", "Refusal", "RequestHead", "guarded_protocol"]

log = logging.getLogger(__name__)

LINGER_S = 5.0  # nginx's lingering_timeout


@dataclass(frozen=True)
class Refusal:
    status: int
    kind: str  # ApiError's kinds: request_too_large, invalid_request, overloaded
    reason: str  # what is counted: header_too_large, too_many_headers, body_too_large, header_timeout, ...
    message: str


@dataclass(frozen=True)
class RequestHead:
    """What a refusal knows of the request it answers (for the dialect's error shape)."""

    path: str
    headers: list[tuple[bytes, bytes]]


# The body of a refusal: a JSON document (the app's error shape). head is None where no head was read.
Render = Callable[[Refusal, RequestHead | None], bytes]


def plain_render(refusal: Refusal, head: RequestHead | None) -> bytes:
    """OpenAI's (and SGLang's) error shape."""
    return msgspec.json.encode({"error": {"message": refusal.message, "type": refusal.kind, "code": refusal.status}})


@dataclass
class ConnectionGuard:
    """What the connections of one server share: the limits, the open connections per client, the refusals."""

    limits: HttpLimits
    render: Render = plain_render
    per_client: collections.Counter[str] = field(default_factory=collections.Counter)
    open: int = 0
    refused: collections.Counter[str] = field(default_factory=collections.Counter)
    lingering: set[asyncio.Transport] = field(default_factory=set)

    def admit(self, client: str) -> Refusal | None:
        lim = self.limits
        if self.open >= lim.max_connections:
            return Refusal(
                503, "overloaded", "too_many_connections", f"the server holds {lim.max_connections} connections"
            )
        if self.per_client[client] >= lim.max_connections_per_client:
            return Refusal(
                503,
                "overloaded",
                "client_connections",
                f"{client} holds {lim.max_connections_per_client} connections to this server",
            )
        self.open += 1
        self.per_client[client] += 1
        return None

    def release(self, client: str) -> None:
        self.open -= 1
        self.per_client[client] -= 1
        if not self.per_client[client]:
            del self.per_client[client]

    def answer(self, transport: asyncio.Transport, refusal: Refusal, head: RequestHead | None) -> None:
        """Write the refusal, shut the write side, discard what comes for ``LINGER_S``, then close."""
        self.refused[refusal.reason] += 1
        body = self.render(refusal, head)
        status = HTTPStatus(refusal.status)
        lines = [
            f"HTTP/1.1 {status.value} {status.phrase}",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close",
        ]
        if refusal.status == 503:
            lines.append("retry-after: 1")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        if transport.can_write_eof():
            transport.write_eof()
        transport.resume_reading()  # to drain: a connection whose reads are paused would never see the client's end
        self.lingering.add(transport)
        asyncio.get_running_loop().call_later(LINGER_S, self._close, transport)

    def _close(self, transport: asyncio.Transport) -> None:
        self.lingering.discard(transport)
        transport.abort()

    def close_lingering(self) -> None:
        for t in list(self.lingering):
            self._close(t)


class _Refused(Exception):
    """Raised from a parser callback to stop the parser; the refusal is in ``_GuardedHttp._pending``."""


class _GuardedHttp(HttpToolsProtocol):
    guard: ConnectionGuard  # set on the class ``guarded_protocol`` makes per server

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._lim = self.guard.limits
        self._peer: str | None = None  # admitted: counted against its client
        self._answered = False  # refused: what comes is discarded
        self._head_open = True  # reading a request head (or waiting for one)
        self._head_bytes = 0
        self._tail = b""  # the last bytes of the head so far (a CRLFCRLF split over two reads)
        self._head_deadline: float | None = None  # None: no head begun (idle between requests: keep-alive's)
        self._header_count = 0
        self._body_bytes = 0
        self._in_body = False
        self._last_read = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._pending: tuple[Refusal, bool] | None = None  # (refusal, whether the head was read)
        self._write_timer: asyncio.TimerHandle | None = None  # armed while the transport's writes are paused

    # --- connections ---------------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else "unix"
        refusal = self.guard.admit(client)
        if refusal is not None:
            self.transport = transport
            self._answered = True
            log.info("refused a connection from %s: %s", client, refusal.message)  # a flood: counted, not logged loud
            self.guard.answer(transport, refusal, None)
            return
        self._peer = client
        super().connection_made(transport)
        self._head_deadline = self.loop.time() + self._lim.header_timeout_s
        self._timer = self.loop.call_later(self._lim.header_timeout_s, self._on_timer)

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard.lingering.discard(self.transport)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._cancel_write_timer()
        if self._peer is None:  # refused at the accept: uvicorn never knew it
            return
        self.guard.release(self._peer)
        self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._answered:
            return
        if self._head_open and not self._head_fits(data):
            self._refuse(
                Refusal(
                    431,
                    "request_too_large",
                    "header_too_large",
                    f"the request line and headers are larger than {self._lim.max_header_bytes} bytes",
                ),
                head=False,
            )
            return
        if self._in_body:
            self._last_read = self.loop.time()
        super().data_received(data)
        if self._timer is None and not self._answered:
            if self._head_open and self._head_deadline is not None:
                self._timer = self.loop.call_at(self._head_deadline, self._on_timer)
            elif self._in_body:
                self._timer = self.loop.call_later(self._lim.body_timeout_s, self._on_timer)

    def _head_fits(self, data: bytes) -> bool:
        """Count this read against the head; False once the head (so far) is over the limit."""
        at = data.find(b"\r\n\r\n")
        end = at + 4 if at >= 0 else None  # how many bytes of this read are the head's
        if end is None and self._tail:
            at = (self._tail + data[:3]).find(b"\r\n\r\n")
            if at >= 0:
                end = at + 4 - len(self._tail)
        if end is None:
            self._head_bytes += len(data)
            self._tail = (self._tail + data[-3:])[-3:]
            return self._head_bytes <= self._lim.max_header_bytes
        fits = self._head_bytes + end <= self._lim.max_header_bytes
        self._head_bytes, self._tail = 0, b""
        return fits

    # --- a client that stops reading ------------------------------------------------------------------

    def pause_writing(self) -> None:
        # The transport's buffer is past its high-water mark: the client is not taking what was sent.
        super().pause_writing()
        if self._write_timer is None and self._peer is not None:
            self._write_timer = self.loop.call_later(self._lim.write_timeout_s, self._on_write_timeout)

    def resume_writing(self) -> None:
        self._cancel_write_timer()
        super().resume_writing()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _on_write_timeout(self) -> None:
        self._write_timer = None
        if self.transport.is_closing() and self.transport.get_write_buffer_size() == 0:
            return
        self.guard.refused["write_timeout"] += 1
        log.info(
            "closed the connection of %s: it took nothing of the response for %g s (%d bytes unsent)",
            self._peer,
            self._lim.write_timeout_s,
            self.transport.get_write_buffer_size(),
        )
        self._answered = True
        self._cancel_timer()
        # Aborted, not closed: close() would wait for the buffer to drain, which is what never happens. uvicorn's
        # connection_lost marks the cycle disconnected and wakes a send waiting to drain.
        self.transport.abort()

    # --- parser callbacks ----------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._header_count = 0
        if self._head_deadline is None:  # a kept-alive connection's next request: its head's time starts now
            self._head_deadline = self.loop.time() + self._lim.header_timeout_s

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count > self._lim.max_headers:
            self._pending = (
                Refusal(
                    431, "request_too_large", "too_many_headers", f"more than {self._lim.max_headers} header lines"
                ),
                False,
            )
            raise _Refused
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._head_open = False
        self._head_deadline = None
        self._cancel_timer()
        for name, value in self.headers:
            if name == b"content-length" and int(value) > self._lim.max_body_bytes:
                self._pending = (self._too_large(), True)
                raise _Refused
        self._body_bytes = 0
        self._in_body = True
        self._last_read = self.loop.time()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > self._lim.max_body_bytes:
            self._pending = (self._too_large(), True)
            raise _Refused
        super().on_body(body)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_body = False
        self._cancel_timer()
        self._head_open, self._head_bytes, self._tail = True, 0, b""

    def send_400_response(self, msg: str) -> None:
        # uvicorn's answer to any parser error, a callback's included: the refusal that stopped the parser, if any.
        if self._pending is None:
            self._answered = True  # uvicorn closes it: nothing more to time or read
            self._cancel_timer()
            super().send_400_response(msg)
            return
        refusal, with_head = self._pending
        self._pending = None
        self._refuse(refusal, head=with_head)

    # --- timeouts and refusals -----------------------------------------------------------------------

    def _too_large(self) -> Refusal:
        return Refusal(
            413, "request_too_large", "body_too_large", f"request body is larger than {self._lim.max_body_bytes} bytes"
        )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _on_timer(self) -> None:
        self._timer = None
        now = self.loop.time()
        if self._head_open and self._head_deadline is not None:
            if now < self._head_deadline:
                self._timer = self.loop.call_at(self._head_deadline, self._on_timer)
                return
            message = f"the request head did not arrive within {self._lim.header_timeout_s:g} s"
            self._refuse(Refusal(408, "invalid_request", "header_timeout", message), head=False)
        elif self._in_body:
            quiet = now - self._last_read
            if self.flow.read_paused or quiet < self._lim.body_timeout_s:  # paused: the app has not read it yet
                wait = self._lim.body_timeout_s - (0 if self.flow.read_paused else quiet)
                self._timer = self.loop.call_later(wait, self._on_timer)
                return
            message = f"the request body stalled for {self._lim.body_timeout_s:g} s"
            self._refuse(Refusal(408, "invalid_request", "body_timeout", message), head=True)

    def _refuse(self, refusal: Refusal, *, head: bool) -> None:
        self._answered = True
        self._cancel_timer()
        self._unset_keepalive_if_required()
        # Too large: a client to fix (a harness's config), worth a warning. Timeouts: what a flood looks like.
        level = logging.INFO if refusal.status == 408 else logging.WARNING
        log.log(level, "refused a request from %s: %d %s", self._peer, refusal.status, refusal.message)
        cycle = self.cycle
        if self._in_body and cycle is not None:  # mid-body: the cycle is this request's; its app sees the client leave
            cycle.disconnected = True
            cycle.message_event.set()
            busy = cycle.response_started  # the app answered already (or is answering): no room for ours
        else:  # a head: the cycle (if any) is the request before, maybe still answering (pipelined)
            busy = cycle is not None and not cycle.response_complete
        if busy:
            self.guard.refused[refusal.reason] += 1
            self.transport.abort()
            return
        self.flow.resume_reading()
        self.guard.answer(self.transport, refusal, self._head() if head else None)

    def _head(self) -> RequestHead:
        path = httptools.parse_url(self.url).path.decode("ascii", "replace") if self.url else ""
        return RequestHead(self.root_path + path, list(self.headers or []))


def guarded_protocol(guard: ConnectionGuard) -> type[asyncio.Protocol]:
    """The protocol class for one server (uvicorn's ``http=``), its connections sharing ``guard``."""
    return type("GuardedHttpToolsProtocol", (_GuardedHttp,), {"guard": guard})
