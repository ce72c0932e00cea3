"""A trivially fast OpenAI-style streaming server (raw asyncio, keep-alive): each request gets one content
chunk, a usage chunk and [DONE] immediately, so what limits requests/s is the client (and the shared cores)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import socket


def _sse(obj: object) -> bytes:
    data = f"data: {json.dumps(obj)}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
_CHUNK = {
    "id": "c",
    "object": "chat.completion.chunk",
    "model": "m",
    "choices": [{"index": 0, "delta": {"content": "ok"}}],
}
_USAGE = {
    "id": "c",
    "object": "chat.completion.chunk",
    "model": "m",
    "choices": [],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1, "total_tokens": 5},
}
_BODY = (
    _HEAD
    + _sse({**_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    + _sse(_CHUNK)
    + _sse({**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    + _sse(_USAGE)
    + b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"
)


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            n = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    n = int(line[15:])
            if n:
                await reader.readexactly(n)
            writer.write(_BODY)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


def _serve(sock: socket.socket) -> None:
    async def main() -> None:
        server = await asyncio.start_server(_handle, sock=sock)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def start(processes: int = 1) -> tuple[str, list[multiprocessing.process.BaseProcess]]:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1024)
    ctx = multiprocessing.get_context("fork")
    procs: list[multiprocessing.process.BaseProcess] = [
        ctx.Process(target=_serve, args=(sock,), daemon=True) for _ in range(processes)
    ]
    for p in procs:
        p.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", procs
