"""The sampling temperature travels with every recorded call: the trainer computes its logprobs at the same
one, and a call whose logprobs are at no temperature it can reproduce is recorded as unknown (None)."""

from __future__ import annotations

from typing import Any

from opengyre.proxy._temperature import logprob_temperature

from .conftest import Stack

M = "opengyre-tiny"


async def test_each_call_records_the_temperature_of_its_logprobs(stack: Stack) -> None:
    client = stack.openai("ex-t")
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    await client.chat.completions.create(model=M, messages=msgs, max_tokens=4, temperature=0.7)
    await client.chat.completions.create(model=M, messages=msgs, max_tokens=4)  # the dialect's default: 1
    await client.chat.completions.create(model=M, messages=msgs, max_tokens=4, temperature=0)  # greedy
    await client.chat.completions.create(model=M, messages=msgs, max_tokens=4, frequency_penalty=0.5)
    events = await stack.assert_recorded_matches_engines()
    assert [e.temperature for e in events] == [0.7, 1.0, 1.0, None]


def test_the_rule_per_engine_kind() -> None:
    sglang = dict(raw_logprobs=False)
    assert logprob_temperature({"temperature": 0.7}, **sglang) == 0.7
    assert logprob_temperature({"temperature": 0.0}, **sglang) == 1.0  # greedy: the raw logits' logprobs
    assert logprob_temperature({"temperature": 0.7, "top_k": 1}, **sglang) is None  # SGLang: batch-dependent
    assert logprob_temperature({}, **sglang) is None  # nothing says what the engine used
    assert logprob_temperature({"temperature": 0.7, "logit_bias": {"5": 1.0}}, **sglang) is None
    assert logprob_temperature({"temperature": 0.7}, raw_logprobs=True) is None  # vLLM's raw logprobs
    assert logprob_temperature({"temperature": 1.0}, raw_logprobs=True) == 1.0
