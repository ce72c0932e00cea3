"""vLLM's OpenAI server as the backend (``vllm+http://``): token ids in via /v1/completions, token ids and
logprobs out, and a drain that closes the stream. The CPU engine's completions route speaks that protocol."""

from __future__ import annotations

from typing import Any

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog
from opengyre.proxy.engines._vllm import to_vllm

from .conftest import make_stack

M = "opengyre-tiny"


def test_sglang_sampling_params_become_vllm_fields() -> None:
    body = to_vllm(
        {
            "rid": "r1",
            "input_ids": [1, 2],
            "sampling_params": {
                "max_new_tokens": 5,
                "min_new_tokens": 1,
                "sampling_seed": 3,
                "temperature": 0.5,
                "logit_bias": {7: 1.0},
                "stop": ["x"],
            },
        },
        "m",
    )
    assert body == {
        "model": "m",
        "prompt": [1, 2],
        "return_token_ids": True,
        "logprobs": 0,
        "stream": True,
        "request_id": "r1",
        "max_tokens": 5,
        "min_tokens": 1,
        "seed": 3,
        "temperature": 0.5,
        "logit_bias": {"7": 1.0},
        "stop": ["x"],
    }


async def test_calls_through_a_vllm_backend_record_what_it_produced(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {})
    st.engines.update({"va": engine_a, "vb": engine_b})
    await st.gateway.pool.add("va", "vllm+" + engine_a.url)
    try:
        client = st.openai("ex-vllm")
        m1: list[Any] = [{"role": "user", "content": "hi"}]
        r1 = await client.chat.completions.create(model=M, messages=m1, max_tokens=6)
        m2 = [
            *m1,
            {"role": "assistant", "content": r1.choices[0].message.content or ""},
            {"role": "user", "content": "more"},
        ]
        text = ""
        async for ch in await client.chat.completions.create(model=M, messages=m2, max_tokens=6, stream=True):
            text += ch.choices[0].delta.content or "" if ch.choices else ""
        events = await st.assert_recorded_matches_engines()
        assert [e.branch for e in events] == ["root", "extension"] and events[1].engine_id == "va"

        # A drain closes the stream; the rest is re-issued from exactly the tokens that came through.
        await st.gateway.pool.add("vb", "vllm+" + engine_b.url)
        stream = await st.openai("ex-vllm-2").chat.completions.create(
            model=M, messages=m1, max_tokens=1500, stream=True, extra_body={"ignore_eos": True}
        )
        n, finish = 0, None
        async for ch in stream:
            n += 1
            finish = (ch.choices[0].finish_reason if ch.choices else None) or finish
            if n == 10:
                busy = [h.engine_id for h in st.gateway.pool.engines() if h.inflight]
                assert await st.gateway.pool.drain(busy[0]) == 1
        assert finish == "length"
        e = (await st.recorded())[-1]
        assert e.attempts == 2 and len(e.output_ids) == 1500
        first, second = st.engine_records(e.call_id)
        n1 = len(e.output_ids) - len(second.output_ids)
        assert list(first.output_ids[:n1]) == list(e.output_ids[:n1])  # what came through before the close
        prompt = list(first.input_ids)
        assert list(second.input_ids) == prompt + list(e.output_ids[:n1])
        assert list(second.output_ids) == list(e.output_ids[n1:])
    finally:
        await st.gateway.stop()
