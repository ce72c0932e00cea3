"""Attacks on the HTTP server the gateway and the CPU engine serve with (issue 24 item 5), over real sockets against
a real uvicorn serving a Starlette app: oversized heads, 10k headers, oversized bodies, slowloris heads and bodies,
too many connections from one client. Each counts what the server refused (``HttpServer.refused``) and what the
app saw; each waits on the socket (a response, its end), never on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from opengyre.asgi import HttpServer
from opengyre.config import HttpLimits

from ..._polling import await_until

KIB, MIB = 1024, 1024 * 1024


class App:
    """/health, and /echo: reads the body, answers its size; counts the bodies it was handed and lost."""

    def __init__(self) -> None:
        self.bodies: list[int] = []
        self.disconnected = 0
        self.app = Starlette(
            routes=[Route("/health", self.health), Route("/echo", self.echo, methods=["POST"])],
        )

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def echo(self, request: Request) -> Response:
        size = 0
        try:
            async for chunk in request.stream():
                size += len(chunk)
        except ClientDisconnect:
            self.disconnected += 1
            return Response(status_code=499)  # dropped by the server: the client is gone
        self.bodies.append(size)
        return JSONResponse({"bytes": size})


async def serve(limits: HttpLimits) -> tuple[HttpServer, App]:
    app = App()
    srv = HttpServer(app.app, limits=limits)
    await srv.start()
    return srv, app


@pytest.fixture
async def small() -> AsyncIterator[tuple[HttpServer, App]]:
    """Limits small enough to reach quickly; timeouts long enough that only the timeout tests meet them."""
    srv, app = await serve(
        HttpLimits(max_header_bytes=8 * KIB, max_headers=20, max_body_bytes=1 * MIB, header_timeout_s=60)
    )
    yield srv, app
    await srv.stop()


async def connect(srv: HttpServer, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", srv.port, local_addr=(source, 0))


async def response(
    reader: asyncio.StreamReader, answered: asyncio.Event | None = None
) -> tuple[int, dict[str, str], bytes]:
    """Read a whole response up to the server's close (every refusal closes): status, headers, body.
    ``answered`` is set once its first line is in (a sender stops there)."""
    first = await reader.readuntil(b"\r\n")
    if answered is not None:
        answered.set()
    raw = first + await reader.read(-1)  # to EOF: returns once the server has shut its side
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), {k.lower(): v for k, v in headers.items()}, body


async def pump(writer: asyncio.StreamWriter, chunks: AsyncIterator[bytes], until: asyncio.Event | None = None) -> int:
    """Write until the chunks run out, ``until`` is set or the server stops taking them; how many bytes went."""
    sent = 0
    try:
        async for chunk in chunks:
            if until is not None and until.is_set():
                break
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)
            await asyncio.sleep(0)  # let the server read (and answer) between writes, as a network would
    except ConnectionError:
        pass
    return sent


async def repeat(chunk: bytes, times: int) -> AsyncIterator[bytes]:
    for _ in range(times):
        yield chunk


@pytest.mark.parametrize("header_mib", [1, 16, 128])
async def test_an_oversized_header_is_431_and_not_held(small: tuple[HttpServer, App], header_mib: int) -> None:
    srv, app = small
    reader, writer = await connect(srv)
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
        chunk = b"a" * (64 * KIB)
        answered = asyncio.Event()
        sender = asyncio.create_task(pump(writer, repeat(chunk, header_mib * 16), answered))
        status, headers, body = await response(reader, answered)
        sent = await sender
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
        writer.close()
    assert status == 431 and headers["connection"] == "close"
    assert "larger than 8192 bytes" in json.loads(body)["error"]["message"]
    assert srv.refused == {"header_too_large": 1} and app.bodies == []
    # Answered before the header was all sent, holding none of it (before: httptools buffered all of it, then 200).
    assert sent < header_mib * MIB and peak < 2 * MIB, (sent, peak)


@pytest.mark.parametrize(("count", "reason"), [(10_000, "header_too_large"), (21, "too_many_headers")])
async def test_too_many_headers_are_431(small: tuple[HttpServer, App], count: int, reason: str) -> None:
    """10k headers pass the 8 KiB head first; 21 short ones (400 bytes) are over the count alone."""
    srv, app = small
    reader, writer = await connect(srv)
    head = b"GET /health HTTP/1.1\r\nhost: x\r\n" + b"".join(b"x-%d: v\r\n" % i for i in range(count)) + b"\r\n"
    sender = asyncio.create_task(pump(writer, repeat(head, 1)))
    status, _, body = await response(reader)
    await sender
    writer.close()
    assert status == 431, body
    assert srv.refused == {reason: 1} and app.bodies == []


async def test_a_body_declared_over_the_limit_is_413_before_it_is_sent(small: tuple[HttpServer, App]) -> None:
    srv, app = small
    reader, writer = await connect(srv)
    # 1 GiB declared, 64 KiB sent: the answer comes without the rest (the client reads it, then stops sending).
    writer.write(
        b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (1 << 30)
    )
    writer.write(b"[" * (64 * KIB))
    await writer.drain()
    status, headers, body = await response(reader)
    writer.close()
    assert status == 413 and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "request_too_large"
    assert srv.refused == {"body_too_large": 1}
    assert app.bodies == [] and app.disconnected == 0  # the app never saw the request


async def test_a_chunked_body_over_the_limit_is_413_once_past_it(small: tuple[HttpServer, App]) -> None:
    srv, app = small
    reader, writer = await connect(srv)
    writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
    piece = 64 * KIB
    frame = b"%x\r\n" % piece + b"a" * piece + b"\r\n"
    answered = asyncio.Event()
    sender = asyncio.create_task(pump(writer, repeat(frame, 1024), answered))  # 64 MiB offered
    status, _, _ = await response(reader, answered)
    sent = await sender
    writer.close()
    assert status == 413
    assert srv.refused == {"body_too_large": 1}
    await await_until(lambda: app.disconnected == 1, "the app saw its client leave")
    assert app.bodies == [] and sent < 64 * MIB


async def test_slowloris_heads_are_closed_at_the_header_timeout_while_others_are_served() -> None:
    srv, _ = await serve(HttpLimits(header_timeout_s=0.5))
    stop = asyncio.Event()

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        try:
            while not stop.is_set():
                writer.write(b"x")  # one byte of a header that never ends, every 50 ms
                await writer.drain()
                await asyncio.sleep(0.05)
        except ConnectionError:
            pass

    try:
        conns = [await connect(srv) for _ in range(50)]
        trickles = [asyncio.create_task(trickle(w)) for _, w in conns]
        await await_until(lambda: srv.connections == 50, "all 50 connections accepted")
        async with httpx.AsyncClient() as c:  # served meanwhile
            assert (await c.get(f"{srv.url}/health")).status_code == 200
        answers = [await response(r) for r, _ in conns]  # each ends: the server closed it
        stop.set()
        await asyncio.gather(*trickles)
        assert [a[0] for a in answers] == [408] * 50
        assert srv.refused == {"header_timeout": 50}
        await await_until(lambda: srv.connections == 0, "every slow connection released")
    finally:
        for _, w in conns:
            w.close()
        await srv.stop()


async def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout() -> None:
    srv, _ = await serve(HttpLimits(header_timeout_s=0.3))
    try:
        reader, writer = await connect(srv)
        status, _, _ = await response(reader)
        writer.close()
        assert status == 408 and srv.refused == {"header_timeout": 1}
    finally:
        await srv.stop()


async def test_a_stalled_body_is_408_at_the_body_timeout() -> None:
    srv, app = await serve(HttpLimits(body_timeout_s=0.3))
    try:
        reader, writer = await connect(srv)
        writer.write(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\n" + b"a" * 10)
        await writer.drain()
        status, _, _ = await response(reader)  # nothing more is sent
        writer.close()
        assert status == 408 and srv.refused == {"body_timeout": 1}
        await await_until(lambda: app.disconnected == 1, "the app saw its client leave")
    finally:
        await srv.stop()


async def test_too_many_connections_from_one_client_are_refused_while_another_is_served() -> None:
    srv, _ = await serve(HttpLimits(max_connections_per_client=4, max_connections=6))
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(4):
            held.append((await connect(srv))[1])
        await await_until(lambda: srv.connections == 4, "4 connections of 127.0.0.1 accepted")
        reader, writer = await connect(srv)  # the fifth of 127.0.0.1
        writer.write(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        status, headers, body = await response(reader)
        writer.close()
        assert status == 503 and headers["retry-after"] == "1", body
        assert srv.refused == {"client_connections": 1}
        # Another client address is served meanwhile, on connections of its own.
        async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2")) as other:
            assert (await other.get(f"{srv.url}/health")).status_code == 200
            held.append((await connect(srv, "127.0.0.2"))[1])
            await await_until(lambda: srv.connections == 6, "the server holds its 6")
            reader, writer = await connect(srv, "127.0.0.3")  # over the total
            status, _, _ = await response(reader)
            writer.close()
            assert status == 503 and srv.refused == {"client_connections": 1, "too_many_connections": 1}
        for w in held:
            w.close()
        await await_until(lambda: srv.connections == 0, "the held connections released")
        async with httpx.AsyncClient() as c:  # 127.0.0.1 is served again
            assert (await c.get(f"{srv.url}/health")).status_code == 200
    finally:
        await srv.stop()


async def test_a_large_legitimate_request_is_served_with_the_default_limits() -> None:
    srv, app = await serve(HttpLimits())
    try:
        body = json.dumps({"messages": [{"role": "user", "content": "x" * (6 * MIB)}]}).encode()
        async with httpx.AsyncClient() as c:
            for _ in range(3):  # kept alive: each head counted afresh
                r = await c.post(f"{srv.url}/echo", content=body, headers={"content-type": "application/json"})
                assert r.status_code == 200 and r.json() == {"bytes": len(body)}
            chunked = await c.post(f"{srv.url}/echo", content=repeat(body[:MIB], 5))
            assert chunked.status_code == 200 and chunked.json() == {"bytes": 5 * MIB}
        assert app.bodies == [len(body)] * 3 + [5 * MIB] and srv.refused == {}
    finally:
        await srv.stop()


class Streamer:
    """/stream: 64 KiB chunks, up to 1 GiB, for as long as the client takes them; counts what it made and how it
    ended (a client that left cancels it)."""

    CHUNK = 64 * KIB

    def __init__(self) -> None:
        self.made = 0
        self.ended: list[str] = []
        self.app = Starlette(routes=[Route("/stream", self.stream), Route("/health", self.health)])

    async def health(self, request: Request) -> Response:
        return JSONResponse({"ok": True})

    async def stream(self, request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            try:
                for _ in range(16 * 1024):
                    self.made += 1
                    yield b"a" * self.CHUNK
                    await asyncio.sleep(0)  # a producer that awaits between chunks, as one reading an engine does
                self.ended.append("complete")
            except BaseException:
                self.ended.append("cancelled")
                raise

        return StreamingResponse(body(), media_type="text/event-stream")


async def stalled_reader(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection with a 4 KiB receive buffer (set before connecting: it bounds the window it offers)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 * KIB)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=4 * KIB)


async def test_a_client_that_stops_reading_a_stream_is_closed_at_the_write_timeout() -> None:
    """Before: the response waited for the client's buffers to drain for ever, holding the connection and the
    app's stream. Now it is cut at the write deadline; what the server holds meanwhile stays bounded."""
    app = Streamer()
    srv = HttpServer(app.app, limits=HttpLimits(write_timeout_s=0.5))
    await srv.start()
    writer: asyncio.StreamWriter | None = None
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        reader, writer = await stalled_reader(srv.port)
        writer.write(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        first = await reader.readuntil(b"\r\n")  # the response started; then nothing more is read
        assert first.startswith(b"HTTP/1.1 200")
        await await_until(lambda: srv.refused["write_timeout"] == 1, "the stalled reader cut at the deadline")
        await await_until(lambda: app.ended == ["cancelled"], "the app's stream cancelled: its client left")
        peak = tracemalloc.get_traced_memory()[1] - base
        made = app.made
        await await_until(lambda: srv.connections == 0, "the connection released")
        # What the client had not read ends with the close (a reset or an EOF), far short of the 1 GiB offered.
        received = 0
        with contextlib.suppress(ConnectionError):
            while chunk := await reader.read(1 << 20):
                received += len(chunk)
        assert received < made * Streamer.CHUNK < 1 << 30
        # The chunks the kernel's buffers took, plus the transport's high-water mark: never the stream.
        assert peak < 2 * MIB, (peak, made)
        async with httpx.AsyncClient() as c:  # served meanwhile
            assert (await c.get(f"{srv.url}/health")).status_code == 200
        assert srv.refused == {"write_timeout": 1}
    finally:
        tracemalloc.stop()
        if writer is not None:
            writer.close()
        await srv.stop()


async def test_a_client_that_reads_a_large_stream_is_not_cut() -> None:
    """The deadline is on a stall, not on the response: 64 MiB of it read at the client's pace, never cut."""
    app = Streamer()
    srv = HttpServer(app.app, limits=HttpLimits(write_timeout_s=0.5))
    await srv.start()
    try:
        async with httpx.AsyncClient() as c, c.stream("GET", f"{srv.url}/stream") as r:
            got = 0
            async for chunk in r.aiter_bytes():
                got += len(chunk)
                if got >= 64 * MIB:
                    break
        assert got >= 64 * MIB and srv.refused == {}
    finally:
        await srv.stop()
