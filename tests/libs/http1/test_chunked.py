"""Chunked bodies decoded from bulk reads: whatever way the bytes are cut on the wire (a size line split, a
chunk's data split, trailers), the chunks come out whole and the connection stays usable for the next request."""

from __future__ import annotations

import asyncio

import pytest

from opengyre.http1 import Http1Error, Http1Pool

BODY = [b"data: one\n\n", b"x" * 70_000, b"data: [DONE]\n\n"]  # one chunk larger than a bulk read (64 KiB)


def _wire(trailer: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
    chunks = b"".join(f"{len(c):x};ext=1\r\n".encode() + c + b"\r\n" for c in BODY)
    return head + chunks + b"0\r\n" + trailer + b"\r\n"


async def _serve(piece: int, trailer: bytes, close_after: int | None = None) -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served = 0
        while await reader.readuntil(b"\r\n\r\n"):
            wire = _wire(trailer)
            if close_after is not None and served == close_after:
                wire = wire[: len(wire) // 2]  # half a body, then the connection closes
            for i in range(0, len(wire), piece):
                writer.write(wire[i : i + piece])
                await writer.drain()
            served += 1
            if close_after is not None and served > close_after:
                writer.close()
                return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.mark.parametrize(("piece", "trailer"), [(1, b""), (7, b"x-check: 1\r\n"), (1 << 20, b"")])
async def test_chunks_come_out_whole_however_the_wire_is_cut(piece: int, trailer: bytes) -> None:
    server, port = await _serve(piece, trailer)
    pool = Http1Pool(f"http://127.0.0.1:{port}", read_timeout=30)
    try:
        for _ in range(2):  # the second request reuses the connection: the first body's end was found exactly
            resp = await pool.request("POST", "/v1/chat/completions", b"{}")
            assert resp.status == 200
            assert [c async for c in resp.chunks()] == BODY
        assert pool.connects == 1
    finally:
        await pool.close()
        server.close()


async def test_a_body_cut_short_is_an_error_not_a_shorter_body() -> None:
    server, port = await _serve(4096, b"", close_after=0)
    pool = Http1Pool(f"http://127.0.0.1:{port}", read_timeout=30)
    try:
        resp = await pool.request("POST", "/", b"{}")
        with pytest.raises(Http1Error, match="closed the connection mid-body"):
            _ = [c async for c in resp.chunks()]
    finally:
        await pool.close()
        server.close()
