"""The load generator against the built-in CPU engine over real HTTP, and against misbehaving servers."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import pytest
import torch

from opengyre.bench import (
    LoadConfig,
    Slo,
    TokenFill,
    cross_check_tokens,
    paper_profile,
    run_load,
    summarise,
    synthesise_sessions,
)
from opengyre.engine import EngineConfig, EngineServer
from opengyre.models import load_tokenizer

from .._polling import await_until
from ._scripted import ScriptedServer


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> object:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
async def engine() -> AsyncIterator[EngineServer]:
    async with EngineServer(EngineConfig(port=0)) as srv:
        yield srv


# The tiny model's ids past its 256 bytes have no text (8 specials, skipped from content, and 23 padding rows
# of the output layer): it samples one ~8 % of the time, and a turn whose only token is one streams no content,
# which the load generator rightly counts as a failed request. The bias keeps these runs about the generator.
TEXT_ONLY: dict[str, object] = {"logit_bias": {str(t): -100 for t in range(256, 288)}}


def _plans(n: int = 3, seed: int = 0) -> list:  # type: ignore[type-arg]
    # chatbot shrunk to a few dozen tokens and 3 turns, so the tiny model answers in milliseconds
    prof = paper_profile("chatbot").scaled(length=0.03, turns=0.3)
    return synthesise_sessions(prof, n, TokenFill.for_tokenizer(load_tokenizer()), seed=seed)


async def test_snowball_is_real_and_usage_agrees_with_the_tokenizer(engine: EngineServer) -> None:
    plans = _plans()
    cfg = LoadConfig(
        engine.url, engine.engine.config.model_name, concurrency=2, record_messages=True, extra_body=TEXT_ONLY
    )
    run = await run_load(cfg, plans)
    assert not run.partial, run.errors
    by_session: dict[str, list] = {}  # type: ignore[type-arg]
    for r in run.requests:
        by_session.setdefault(r.session, []).append(r)
    assert len(by_session) == 3
    multi = 0
    for plan in plans:
        reqs = sorted(by_session[plan.session_id], key=lambda r: r.turn)
        assert len(reqs) == len(plan.turns)
        for k, r in enumerate(reqs):
            # turn k's prompt: every earlier turn's messages and the server's actual replies, in order
            expected: list = []  # type: ignore[type-arg]
            for j in range(k + 1):
                expected += list(plan.turns[j].messages)
                if j < k:
                    expected.append({"role": "assistant", "content": reqs[j].reply})
            assert r.messages == expected
            assert r.output_tokens == plan.turns[k].max_tokens  # ignore_eos: the recorded length, exactly
            if k:
                multi += 1
                assert r.prompt_tokens > reqs[k - 1].prompt_tokens + reqs[k - 1].output_tokens - 1
    assert multi > 0, "no multi-turn session: the snowball check proved nothing"
    check = cross_check_tokens(run.requests, load_tokenizer())
    assert check == {"checked": len(run.requests), "mismatched": 0}
    s = summarise(run, Slo(ttft_s=60.0))
    assert s["requests_ok"] == len(run.requests) and not s["partial"]
    assert s["per_turn"]["1"]["n"] == 3
    assert s["ttft_s"]["n"] == len(run.requests) and s["goodput"]["fraction"] == 1.0
    assert s["output_short_of_max"] == 0


async def test_two_worker_processes_and_poisson_arrivals(engine: EngineServer) -> None:
    plans = _plans(4, seed=5)
    name = engine.engine.config.model_name
    run = await run_load(LoadConfig(engine.url, name, concurrency=2, workers=2, extra_body=TEXT_ONLY), plans)
    assert not run.partial, run.errors
    assert {r.session for r in run.requests} == {p.session_id for p in plans}
    open_loop = await run_load(LoadConfig(engine.url, name, concurrency=4, rate=50.0, extra_body=TEXT_ONLY), plans[:2])
    assert not open_loop.partial and open_loop.sessions_completed == 2


async def test_ttft_waits_for_generated_content_not_the_role_chunk() -> None:
    srv = await ScriptedServer("role_first").start()
    try:
        task = asyncio.create_task(run_load(LoadConfig(srv.url, "m"), _one_turn()))
        await await_until(lambda: srv.role_sent_at is not None, "role chunk sent")
        srv.release.set()
        run = await task
    finally:
        await srv.stop()
    r = run.requests[0]  # the first turn's request (the second found the release already given)
    assert len(run.requests) == 2 and r.turn == 1
    assert r.ok and r.reply == "hi!"
    assert srv.released_at is not None
    # the first token came only after the release, so TTFT ends after it, not at the role-only chunk
    assert r.sent + r.ttft >= srv.released_at  # type: ignore[operator]
    assert len(r.itl) == 1


def _one_turn() -> list:  # type: ignore[type-arg]
    from opengyre.bench import SessionPlan, TurnPlan

    return [
        SessionPlan(
            "s", (TurnPlan(({"role": "user", "content": "x"},), 2), TurnPlan(({"role": "user", "content": "y"},), 2))
        )
    ]


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("stall", "server stalled"),
        ("error", "server error mid-stream after 1 chunks: {'message': 'engine died'"),
        ("drop", "server closed the connection mid-stream after 1 chunks"),
        ("http500", "HTTP 500"),
    ],
)
async def test_misbehaving_server_gives_a_clear_partial_result(mode: str, message: str) -> None:
    srv = await ScriptedServer(mode).start()
    try:
        run = await run_load(LoadConfig(srv.url, "m", stall_timeout_s=0.3), _one_turn())
    finally:
        await srv.stop()
    assert run.partial
    [r] = run.requests  # the session stopped at its failed first turn; the second was never sent
    assert not r.ok and message in r.error
    s = summarise(run)
    assert s["partial"] and s["requests_failed"] == 1 and s["requests_ok"] == 0 and message in s["errors"][0]
    assert s["ttft_s"] == {"n": 0}  # no number is made up for what was not measured


async def test_unreachable_server() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        run = await run_load(LoadConfig(f"http://127.0.0.1:{port}", "m"), _one_turn())
    assert run.partial and "server unreachable at http://127.0.0.1:" in run.requests[0].error


async def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError, match=r"workers must be in 1\.\.concurrency"):
        await run_load(LoadConfig("http://x", "m", concurrency=1, workers=2), _one_turn())
    with pytest.raises(ValueError, match="no sessions"):
        await run_load(LoadConfig("http://x", "m"), [])
