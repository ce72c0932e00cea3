"""Never invent data: an engine that answers without a token's behaviour logprob, or with one that is no log
probability (above 0), fails the call with the dialect's error, and nothing is recorded (a 0.0 in its place would
read as probability 1 to the trainer; a +0.7 recorded made the trainer refuse its whole batch later)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import anthropic
import openai
import pytest

from opengyre.asgi import HttpServer
from opengyre.eventlog import EventLog
from opengyre.proxy.engines._client import EngineBadReply, behaviour_logprobs

from ._fake_sglang import LOGPROB, NOISE, fake_sglang
from .conftest import Stack, make_stack

M = "opengyre-tiny"


@pytest.fixture
async def fake_engine(request: pytest.FixtureRequest) -> AsyncIterator[HttpServer]:
    srv = HttpServer(fake_sglang(request.param))
    await srv.start()
    yield srv
    await srv.stop()


async def _stack(event_log: EventLog, engine: HttpServer) -> Stack:
    st = await make_stack(event_log, {})
    await st.gateway.pool.add("fake", engine.url)
    return st


@pytest.mark.parametrize("fake_engine", ["ok"], indirect=True)
async def test_the_fake_engine_is_recorded_when_it_sends_logprobs(event_log: EventLog, fake_engine: HttpServer) -> None:
    st = await _stack(event_log, fake_engine)
    try:
        r = await st.openai("ex").chat.completions.create(model=M, messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "fine"
        [e] = await st.recorded()
        assert e.output_logprobs == [LOGPROB] * len(e.output_ids)
    finally:
        await st.gateway.stop()


@pytest.mark.parametrize("fake_engine", ["noise"], indirect=True)
async def test_float_noise_above_zero_is_a_logprob_and_recorded_as_sent(
    event_log: EventLog, fake_engine: HttpServer
) -> None:
    """Up to 1e-6 above 0 (``opengyre.trajectory.is_logprob``, the trainer's own bound) is float noise."""
    st = await _stack(event_log, fake_engine)
    try:
        r = await st.openai("ex").chat.completions.create(model=M, messages=[{"role": "user", "content": "x"}])
        assert r.choices[0].message.content == "fine"
        [e] = await st.recorded()
        assert e.output_logprobs == pytest.approx([NOISE] * len(e.output_ids), rel=1e-6)  # float32 as stored
        assert all(lp > 0 for lp in e.output_logprobs)  # as sent: not clamped to 0
    finally:
        await st.gateway.stop()


@pytest.mark.parametrize("fake_engine", ["missing", "null", "positive"], indirect=True)
@pytest.mark.parametrize("how", ["openai", "openai-stream", "anthropic", "anthropic-stream"])
async def test_a_reply_without_behaviour_logprobs_is_an_engine_error_and_records_nothing(
    event_log: EventLog,
    fake_engine: HttpServer,
    how: Literal["openai", "openai-stream", "anthropic", "anthropic-stream"],
) -> None:
    st = await _stack(event_log, fake_engine)
    msgs = [{"role": "user", "content": "x"}]
    try:
        if how == "openai":
            with pytest.raises(openai.APIStatusError) as oa:
                await st.openai("ex").chat.completions.create(model=M, messages=msgs)  # type: ignore[arg-type]
            assert oa.value.status_code == 502
            assert oa.value.body["type"] == "server_error"  # type: ignore[index]
            message = str(oa.value.body["message"])  # type: ignore[index]
        elif how == "openai-stream":
            stream = await st.openai("ex").chat.completions.create(model=M, messages=msgs, stream=True)  # type: ignore[arg-type]
            with pytest.raises(openai.APIError) as oe:
                async for _ in stream:
                    pass
            message = str(oe.value)
        elif how == "anthropic":
            with pytest.raises(anthropic.APIStatusError) as an:
                await st.anthropic("ex").messages.create(model=M, messages=msgs, max_tokens=8)  # type: ignore[arg-type]
            assert an.value.status_code == 502
            assert an.value.body["error"]["type"] == "api_error"  # type: ignore[index]
            message = str(an.value.body["error"]["message"])  # type: ignore[index]
        else:
            with pytest.raises(anthropic.APIStatusError) as ae:
                async with st.anthropic("ex").messages.stream(model=M, messages=msgs, max_tokens=8) as s:  # type: ignore[arg-type]
                    async for _ in s:
                        pass
            assert ae.value.body["error"]["type"] == "api_error"  # type: ignore[index]
            message = str(ae.value.body["error"]["message"])  # type: ignore[index]
        assert "logprob" in message and "fake" in message
        assert await st.recorded() == []
    finally:
        await st.gateway.stop()


def test_the_vllm_form_is_held_to_the_same_bound() -> None:
    """vLLM's ``logprobs.token_logprobs`` is a plain list; the parser both dialects share checks it alike."""
    field = "logprobs.token_logprobs"
    assert behaviour_logprobs([-0.5, 0.0, 1e-6], 3, 0, field) == [-0.5, 0.0, 1e-6]
    for bad in ([-0.5, 0.7], [-0.5, 2e-6], [-0.5, float("nan")], [-0.5, float("-inf")]):
        with pytest.raises(EngineBadReply, match=r"output token 4 \(logprobs.token_logprobs\[1\]"):
            behaviour_logprobs(bad, 2, 3, field)
