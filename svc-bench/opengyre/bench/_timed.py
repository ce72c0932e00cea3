"""A real HTTP/1.1 keep-alive server streaming OpenAI chat-completion chunks on a known schedule: the latency
ground truth for the load generator (tests/bench/test_timing.py), a server of known capacity for the sweep's
benchmarks (``slots``: requests served at a time, the rest wait), and an engine that fails or dies on cue.

Per request (after its body is read and, with ``slots``, a slot is free): a role-only chunk and an empty
content chunk at once (neither is a token: a client timing TTFT from them is wrong by the whole TTFT), the first
token at ``ttft``, token k at ``ttft + (k - 1)·itl`` (deadlines from the request's start, so a late wake-up does
not shift the tokens after it), then usage and ``[DONE]``. ``max_tokens`` tokens are sent. Each request's
actual times are recorded (``records``) on the same monotonic clock as the client's.

Faults: ``fail`` — request numbers (0-based, in arrival order) answered HTTP 500; ``die_after`` — from that
request on the server is killed: the request's connection is cut, every open connection closed and the
listening socket shut, so later connections are refused, as with an engine that was killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

__all__ = ["TimedServer", "timed_server_thread"]


def _frame(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _chunk(delta: dict[str, object] | None = None, usage: dict[str, int] | None = None) -> bytes:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": None}]
    body: dict[str, object] = {"id": "t", "object": "chat.completion.chunk", "model": "timed", "choices": choices}
    if usage is not None:
        body["usage"] = usage
    return _frame(f"data: {json.dumps(body)}\n\n".encode())


@dataclass
class Record:
    received: float  # body read
    started: float  # slot taken (= received without slots)
    tokens: list[float]  # when each token's chunk was written
    prompt: str = ""  # the last message's content (which request this was)
    finished: float = 0.0


class TimedServer:
    def __init__(
        self,
        ttft: float,
        itl: float,
        *,
        slots: int | None = None,
        fail: frozenset[int] = frozenset(),
        die_after: int | None = None,
    ) -> None:
        self.ttft, self.itl = ttft, itl
        self.fail, self.die_after = fail, die_after
        self._slots = asyncio.Semaphore(slots) if slots else None
        self.records: list[Record] = []
        self.requests = 0
        self.dead = False
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> TimedServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        for w in list(self._writers):
            w.close()
        if self._server is not None:
            self._server.close()
        # let every handler see its connection end and return (a handler cancelled at loop shutdown is noise)
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def _die(self) -> None:
        self.dead = True
        for w in list(self._writers):
            w.transport.abort()
        if self._server is not None:
            self._server.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if self.dead:
            writer.transport.abort()
            return
        self._writers.add(writer)
        try:
            while True:  # keep-alive: one request after the other on this connection
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                length = next(
                    int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
                )
                body = json.loads(await reader.readexactly(length))
                n = self.requests
                self.requests += 1
                if self.die_after is not None and n >= self.die_after:
                    self._die()
                    return
                if n in self.fail:
                    err = b'{"error": {"message": "scripted failure", "code": 500}}'
                    writer.write(
                        b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: %d\r\n\r\n%s" % (len(err), err)
                    )
                    await writer.drain()
                    continue
                await self._stream(writer, int(body["max_tokens"]), str(body["messages"][-1]["content"]))
        except ConnectionError:
            return  # the client went away, or this server was killed mid-stream
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, n: int, prompt: str) -> None:
        received = time.monotonic()
        async with self._slots or contextlib.nullcontext():
            rec = Record(received, time.monotonic(), [], prompt)
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            writer.write(_chunk({"role": "assistant"}) + _chunk({"content": ""}))
            await writer.drain()
            for k in range(n):
                due = rec.started + self.ttft + k * self.itl
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(_chunk({"content": f" t{k}"}))
                await writer.drain()
                rec.tokens.append(time.monotonic())
            writer.write(_chunk({}, usage={"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}))
            writer.write(_frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
            await writer.drain()
            rec.finished = time.monotonic()
            self.records.append(rec)


@contextlib.contextmanager
def timed_server_thread(
    ttft: float,
    itl: float,
    *,
    slots: int | None = None,
    fail: frozenset[int] = frozenset(),
    die_after: int | None = None,
) -> Iterator[TimedServer]:
    """A ``TimedServer`` on its own event loop in a thread, for code that runs ``asyncio.run`` itself (the CLI)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: list[TimedServer] = []
    stop = asyncio.Event()

    async def serve() -> None:
        srv = await TimedServer(ttft, itl, slots=slots, fail=fail, die_after=die_after).start()
        holder.append(srv)
        ready.set()
        await stop.wait()
        await srv.stop()

    t = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    t.start()
    assert ready.wait(30), "timed server did not start"
    try:
        yield holder[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        t.join(30)
