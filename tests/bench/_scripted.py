"""A real HTTP/1.1 server that streams chat-completion chunks by script, to misbehave on purpose.

Modes: ``role_first`` (a role-only chunk, then content only once ``release`` is set), ``stall`` (two content
chunks, then silence), ``error`` (a content chunk, then an error chunk), ``drop`` (a content chunk, then the
connection closes without [DONE]), ``http500`` (an error status).
"""

from __future__ import annotations

import asyncio
import json
import time


def _chunk(delta: dict[str, object], usage: dict[str, int] | None = None) -> bytes:
    body: dict[str, object] = {"id": "x", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta}]}
    if usage is not None:
        body = {"id": "x", "object": "chat.completion.chunk", "choices": [], "usage": usage}
    data = f"data: {json.dumps(body)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class ScriptedServer:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.release = asyncio.Event()
        self.role_sent_at: float | None = None
        self.released_at: float | None = None
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> ScriptedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def stop(self) -> None:
        for w in self._writers:
            w.close()
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.append(writer)
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length"))
        await reader.readexactly(length)
        if self.mode == "http500":
            body = b'{"error": {"message": "boom"}}'
            writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            await writer.drain()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        if self.mode == "role_first":
            writer.write(_chunk({"role": "assistant", "content": ""}))
            await writer.drain()
            self.role_sent_at = self.role_sent_at or time.monotonic()
            await self.release.wait()
            self.released_at = self.released_at or time.monotonic()  # the first request's
            writer.write(_chunk({"content": "hi"}) + _chunk({"content": "!"}))
            writer.write(_chunk({}, usage={"prompt_tokens": 3, "completion_tokens": 2}))
            writer.write(_chunk_done())
            await writer.drain()
            return
        writer.write(_chunk({"content": "a"}))
        if self.mode == "stall":
            writer.write(_chunk({"content": "b"}))
            await writer.drain()
            await asyncio.Event().wait()  # never again
        if self.mode == "error":
            data = b'data: {"error": {"message": "engine died", "code": 500}}\n\n'
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        await writer.drain()
        writer.close()


def _chunk_done() -> bytes:
    data = b"data: [DONE]\n\n"
    return f"{len(data):x}\r\n".encode() + data + b"\r\n0\r\n\r\n"
