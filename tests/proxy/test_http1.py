"""The engine hop's keep-alive client: stale connections are never reused, a lost race is retried once on a new
connection, and every read is bounded. Against real servers: uvicorn (the CPU engine, with a short keep-alive)
and an h11 server that closes or hangs on cue; idle periods are waited out on an observable (the pooled
sockets seeing the server's close), never on the clock."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opengyre.asgi import HttpServer
from opengyre.config import HttpLimits
from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.http1 import Http1Error, Http1Pool

from .._polling import await_until
from ._h11_server import H11Server
from .conftest import make_stack

M = "opengyre-tiny"


@pytest.fixture
async def h11_server() -> AsyncIterator[H11Server]:
    srv = await H11Server().start()
    yield srv
    await srv.stop()


async def _burst(pool: Http1Pool, n: int) -> None:
    responses = await asyncio.gather(*(pool.request("POST", "/generate", b"{}") for _ in range(n)))
    for r in responses:
        assert r.status == 200
        await r.read()  # the connection goes back to the pool


async def test_a_connection_closed_as_the_request_goes_out_is_retried_on_a_new_one(h11_server: H11Server) -> None:
    pool = Http1Pool(h11_server.url, idle_timeout=3600)
    await _burst(pool, 2)
    assert pool.idle == 2 and h11_server.connections == 2
    h11_server.drop_reused = True  # both pooled connections are now as good as closed by the server
    r = await pool.request("POST", "/generate", b"{}")
    assert r.status == 200 and await r.read() == b'{"ok": true}'
    # One retry, on a connection of its own: the other pooled one had been idle just as long.
    assert pool.retried == 1
    assert h11_server.connections == 3
    await pool.close()


async def test_connections_idle_past_the_limit_are_not_reused(h11_server: H11Server) -> None:
    fresh = Http1Pool(h11_server.url, idle_timeout=0.0)
    for _ in range(3):
        await _burst(fresh, 1)
    assert h11_server.connections == 3 and fresh.idle == 0
    kept = Http1Pool(h11_server.url, idle_timeout=3600)
    for _ in range(3):
        await _burst(kept, 1)
    assert h11_server.connections == 4 and kept.idle == 1
    await kept.close()


async def test_connections_the_server_closed_while_idle_are_dropped_before_use() -> None:
    async def generate(request: Request) -> Response:
        return Response(b'{"ok": true}', media_type="application/json")

    srv = HttpServer(
        Starlette(routes=[Route("/generate", generate, methods=["POST"])]), limits=HttpLimits(keep_alive_s=0.3)
    )
    await srv.start()
    try:
        pool = Http1Pool(srv.url, idle_timeout=3600)  # only the server's closing can make them stale
        await _burst(pool, 4)
        assert pool.idle >= 1
        idle = pool.idle
        await await_until(lambda: pool.idle_closed == idle, "the server closed the idle keep-alive connections")
        await _burst(pool, 4)
        assert pool.stale == idle and pool.retried == 0
        await pool.close()
    finally:
        await srv.stop()


@pytest.mark.parametrize("where", ["head", "body"])
async def test_an_engine_that_goes_silent_fails_the_read_after_the_read_timeout(
    h11_server: H11Server, where: str
) -> None:
    if where == "head":
        h11_server.silent = True
    else:
        h11_server.stall_body = True
    pool = Http1Pool(h11_server.url, read_timeout=0.2)
    with pytest.raises(Http1Error, match="read timeout"):
        r = await pool.request("POST", "/generate", b"{}")
        await r.read()
    assert pool.idle == 0  # a connection left mid-response is never reused
    await pool.close()


async def test_calls_after_the_engine_closed_idle_connections_are_answered(event_log: EventLog) -> None:
    """A burst, an idle period longer than the engine's keep-alive, another burst: every call is answered.

    Before stale connections were dropped, each call of the second burst took a closed connection from the
    pool, retried on another closed one, and ended in 503 "no rollout engine became free".
    """
    async with EngineServer(EngineConfig(port=0, http=HttpLimits(keep_alive_s=0.5))) as engine:
        st = await make_stack(event_log, {"e0": engine}, queue_timeout_s=1.0, engine_idle_timeout_s=3600)
        try:
            client = st.openai("ex-idle")

            async def burst(tag: str) -> None:
                replies = await asyncio.gather(
                    *(
                        client.chat.completions.create(
                            model=M, messages=[{"role": "user", "content": f"{tag} {i}"}], max_tokens=2
                        )
                        for i in range(6)
                    )
                )
                assert all(r.choices[0].finish_reason in ("stop", "length") for r in replies)

            await burst("first")
            fast = st.gateway.pool.engines()[0].client.fast
            assert fast.idle >= 1
            await await_until(lambda: fast.idle_closed == fast.idle, "the engine closed the idle connections")
            try:
                await burst("second")
            except openai.APIStatusError as exc:
                raise AssertionError(f"a call after the idle period failed: {exc}") from exc
            assert fast.stale >= 1 and fast.retried == 0
            assert len(await st.assert_recorded_matches_engines()) == 12
        finally:
            await st.gateway.stop()
