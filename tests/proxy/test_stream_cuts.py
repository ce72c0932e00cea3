"""Streams cut mid-way on the real gateway (issue 24): a client that stops reading (the write deadline), ``n > 1``
streams whose client leaves, and whose engine fails one of the ``n`` samples.
Every dispatch ends (the engine sees each request end), every engine slot is freed, every call is recorded at most once (rows in the real log) and a
failure is counted once. The engine is a gated SGLang-protocol app over real HTTP: it emits a few tokens per
request and then does what the test says, when the test says (asyncio events, never the clock).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import msgspec
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.asgi import HttpServer
from opengyre.config import HttpLimits
from opengyre.eventlog import EventLog

from .._polling import await_until
from .conftest import Stack, make_stack

M = "opengyre-tiny"
_enc = msgspec.json.Encoder()

Then = Literal["finish", "bad", "hold", "flood"]


@dataclass
class Step:
    """What the engine does with one request (by arrival order): ``tokens`` tokens, then waits for ``gate`` (if any)
    and then: ``finish`` (a stop), ``bad`` (a chunk with a logprob above 0: a reply that cannot be recorded),
    ``hold`` (nothing more, until the request is aborted or its connection closed), ``flood`` (tokens until its
    ``max_new_tokens``)."""

    then: Then
    tokens: int = 3
    gate: asyncio.Event | None = None


@dataclass
class GatedEngine:
    steps: list[Step]
    token: int = 97
    started: list[str] = field(default_factory=list)
    ended: dict[str, str] = field(default_factory=dict)  # rid -> how: finished, bad, cut
    aborted: list[str] = field(default_factory=list)
    _cut: dict[str, asyncio.Event] = field(default_factory=dict)

    def app(self) -> Starlette:
        async def info(request: Request) -> Response:
            return Response(
                _enc.encode({"incremental_streaming_output": True, "context_length": 1 << 20, "is_generation": True}),
                media_type="application/json",
            )

        return Starlette(
            routes=[
                Route("/generate", self.generate, methods=["POST"]),
                Route("/abort_request", self.abort, methods=["POST"]),
                Route("/server_info", info),
                Route("/model_info", info),
                Route("/health", info),
            ]
        )

    async def abort(self, request: Request) -> Response:
        rid = msgspec.json.decode(await request.body())["rid"]
        self.aborted.append(rid)
        self._cut.setdefault(rid, asyncio.Event()).set()
        return Response(b"{}", media_type="application/json")

    def _chunk(self, rid: str, ids: list[int], finish: dict[str, Any] | None, logprob: float = -0.5) -> bytes:
        meta = {
            "id": rid,
            "finish_reason": finish,
            "cached_tokens": 0,
            "weight_version": "w0",
            "output_token_logprobs": [[logprob, t, None] for t in ids],
        }
        return b"data: " + _enc.encode({"output_ids": ids, "meta_info": meta}) + b"\n\n"

    async def generate(self, request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        rid = body["rid"]
        step = self.steps[len(self.started)]
        self.started.append(rid)
        cut = self._cut.setdefault(rid, asyncio.Event())
        max_new = int(body["sampling_params"]["max_new_tokens"])
        if not body.get("stream"):  # one JSON reply: only a step that finishes at once
            assert step.then == "finish" and step.gate is None, step
            self.ended[rid] = "finished"
            chunk = self._chunk(rid, [self.token] * step.tokens, {"type": "stop", "matched": 0})
            return Response(chunk.removeprefix(b"data: "), media_type="application/json")

        async def chunks() -> AsyncIterator[bytes]:
            how = "cut"
            try:
                for _ in range(step.tokens):
                    yield self._chunk(rid, [self.token], None)
                if step.gate is not None:
                    await step.gate.wait()
                if step.then == "finish":
                    how = "finished"
                    yield self._chunk(rid, [], {"type": "stop", "matched": 0})
                elif step.then == "bad":
                    how = "bad"
                    yield self._chunk(rid, [self.token], None, logprob=0.7)
                elif step.then == "flood":
                    for _ in range(max_new - step.tokens):
                        yield self._chunk(rid, [self.token], None)
                        await asyncio.sleep(0)  # an engine's tokens come between awaits
                    how = "finished"
                    yield self._chunk(rid, [], {"type": "length", "length": max_new})
                else:
                    await cut.wait()
                yield b"data: [DONE]\n\n"
            finally:
                self.ended[rid] = how

        return StreamingResponse(chunks(), media_type="text/event-stream")


@contextlib.asynccontextmanager
async def gated(event_log: EventLog, steps: list[Step], **config: object) -> AsyncIterator[tuple[Stack, GatedEngine]]:
    engine = GatedEngine(steps)
    srv = HttpServer(engine.app())
    await srv.start()
    stack = await make_stack(event_log, {}, **config)
    await stack.gateway.pool.add("e0", srv.url)
    try:
        yield stack, engine
    finally:
        await stack.gateway.stop()
        await srv.stop()


def inflight(stack: Stack) -> int:
    return sum(len(h.inflight) for h in stack.gateway.pool.engines())


async def rows(stack: Stack, eid: str) -> list[str]:
    """The call ids of the execution's ``model-call-recorded`` events in the log (flushed first)."""
    return [e.call_id for e in await stack.recorded_as_stored() if e.execution_id == eid]


def chat(n: int, max_tokens: int = 64) -> dict[str, Any]:
    return {
        "model": M,
        "messages": [{"role": "user", "content": "go"}],
        "stream": True,
        "n": n,
        "max_tokens": max_tokens,
    }


async def frames(lines: AsyncIterator[str]) -> AsyncIterator[dict[str, Any]]:
    async for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


async def metric(stack: Stack, line: str) -> bool:
    async with httpx.AsyncClient() as c:
        return line in (await c.get(f"{stack.gateway.url}/metrics")).text


async def test_a_client_that_stops_reading_a_stream_is_cut_and_its_dispatch_ended(event_log: EventLog) -> None:
    """A harness that stops reading an endless stream: before, the gateway's send waited for ever, holding the
    connection, the dispatch and its engine slot. Now the write deadline closes it; the engine's request ends,
    its slot is freed, nothing is recorded, nothing counted as the model's failure."""
    limits = HttpLimits(write_timeout_s=0.5)
    async with gated(event_log, [Step("flood")], http=limits) as (stack, engine):
        eid = "slow-reader"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: the window it offers
        sock.setblocking(False)
        port = httpx.URL(stack.gateway.url).port
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        reader, writer = await asyncio.open_connection(sock=sock, limit=4096)
        body = _enc.encode(chat(1, max_tokens=500_000))
        key = stack.gateway.issue_key(eid)
        writer.write(
            b"POST /x/%s/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer %s\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % (eid.encode(), key.encode(), len(body))
            + body
        )
        await writer.drain()
        assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")  # then nothing more is read
        await await_until(
            lambda: metric(stack, 'opengyre_proxy_http_refused_total{reason="write_timeout"} 1.0'),
            "the stalled reader cut at the write deadline",
        )
        await await_until(lambda: inflight(stack) == 0, "the engine slot freed")
        await await_until(lambda: engine.ended.get(engine.started[0]) == "cut", "the engine's request ended")
        writer.close()
        assert engine.started == [engine.started[0]]  # not re-issued: the client left, nothing to finish
        assert await rows(stack, eid) == [] and stack.gateway.failed_calls(eid) == 0
        # The gateway serves the next call of the same execution.
        engine.steps.append(Step("finish"))
        async with stack.openai(eid) as client:
            r = await client.chat.completions.create(model=M, messages=[{"role": "user", "content": "again"}])
        assert r.choices[0].finish_reason == "stop" and len(await rows(stack, eid)) == 1


@pytest.mark.parametrize("finished_first", [0, 1])
async def test_an_n3_stream_whose_client_leaves_ends_every_dispatch(event_log: EventLog, finished_first: int) -> None:
    """n=3, the client leaves mid-stream: the samples still generating end on the engine, every slot is freed; a
    sample that had finished before is recorded once, the others never, and no failure is counted."""
    steps = [Step("finish")] * finished_first + [Step("hold")] * (3 - finished_first)
    async with gated(event_log, steps) as (stack, engine):
        eid = f"leaves-{finished_first}"
        key = stack.gateway.issue_key(eid)
        seen: set[int] = set()

        async def read() -> None:
            async with (
                httpx.AsyncClient() as c,
                c.stream(
                    "POST",
                    f"{stack.gateway.base_url(eid)}/chat/completions",
                    json=chat(3),
                    headers={"authorization": f"Bearer {key}"},
                ) as r,
            ):
                assert r.status_code == 200
                async for f in frames(r.aiter_lines()):
                    seen.update(ch["index"] for ch in f["choices"] if ch["delta"].get("content"))

        reading = asyncio.create_task(read())
        await await_until(
            lambda: seen == {0, 1, 2} and stack.gateway.stats.calls == finished_first,
            "every sample streamed, the finished ones recorded",
        )
        reading.cancel()  # the client leaves: its connection is closed
        with contextlib.suppress(asyncio.CancelledError):
            await reading
        await await_until(lambda: inflight(stack) == 0, "every engine slot freed")
        await await_until(lambda: len(engine.ended) == 3, "every engine request ended")
        assert sorted(engine.ended.values()) == sorted(["finished"] * finished_first + ["cut"] * (3 - finished_first))
        assert len(engine.started) == 3  # none re-issued
        assert len(await rows(stack, eid)) == finished_first
        assert stack.gateway.failed_calls(eid) == 0


async def test_an_n3_stream_whose_engine_fails_one_sample_ends_the_others(event_log: EventLog) -> None:
    """n=3: one sample finishes (recorded), one gets an engine reply that cannot be recorded mid-stream, one is
    still generating. The stream ends with the dialect's error event; the one still generating ends on the engine;
    every slot is freed; one row in the log, one failure counted."""
    fail = asyncio.Event()
    steps = [Step("finish"), Step("bad", gate=fail), Step("hold")]
    async with gated(event_log, steps) as (stack, engine):
        eid = "fails-one"
        key = stack.gateway.issue_key(eid)
        got: list[dict[str, Any]] = []

        async def fail_second() -> None:
            await await_until(
                lambda: stack.gateway.stats.calls == 1 and len(engine.started) == 3, "one recorded, three running"
            )
            fail.set()  # now the second one fails

        failing = asyncio.create_task(fail_second())
        async with (
            httpx.AsyncClient() as c,
            c.stream(
                "POST",
                f"{stack.gateway.base_url(eid)}/chat/completions",
                json=chat(3),
                headers={"authorization": f"Bearer {key}"},
            ) as r,
        ):
            assert r.status_code == 200
            async for f in frames(r.aiter_lines()):
                got.append(f)
        await failing
        assert "error" in got[-1] and got[-1]["error"]["code"] == "engine_error", got[-1]
        await await_until(lambda: inflight(stack) == 0, "every engine slot freed")
        await await_until(lambda: len(engine.ended) == 3, "every engine request ended")
        assert sorted(engine.ended.values()) == ["bad", "cut", "finished"]
        assert len(engine.started) == 3  # the bad reply is not re-issued; the held one was not either
        assert len(await rows(stack, eid)) == 1
        assert stack.gateway.failed_calls(eid) == 1
