"""What a real harness sends, with the official SDKs over real HTTP against the CPU engine (issue 11).

Tool definitions are validated, ``tool_choice`` and ``response_format`` are honoured by constrained decoding
(or refused), ``top_logprobs`` gives alternatives, stops match decoded text only, the engine's context is
learned and enforced before streaming, and unknown routes answer the dialect's JSON error.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog

from ._policy import TOOLS, conversation
from .conftest import Stack, make_stack

M = "opengyre-tiny"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer"}},
    "required": ["city", "days"],
}
OAI_TOOLS: list[Any] = [
    {"type": "function", "function": {"name": "weather", "description": "forecast", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {}}}},
]


async def test_invalid_tool_definitions_are_refused_and_record_nothing(stack: Stack) -> None:
    oai = stack.openai("ex-badtools")
    bad_openai: list[Any] = [
        {"type": "function", "function": {"name": "t", "parameters": "not a schema"}},
        {"type": "function", "function": {"name": "t", "parameters": {"type": "objekt"}}},
        {"type": "function", "function": {"name": "my tool!", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "x" * 65}},
        {"type": "function", "function": {"name": "t", "parameters": {"type": "object", "required": "city"}}},
    ]
    for tool in bad_openai:
        with pytest.raises(openai.BadRequestError) as exc:
            await oai.chat.completions.create(
                model=M, messages=[{"role": "user", "content": "hi"}], tools=[tool], max_tokens=2
            )
        assert exc.value.body["type"] == "invalid_request_error", tool  # type: ignore[index]
    ant = stack.anthropic("ex-badtools")
    bad_anthropic: list[Any] = [
        {"name": "t"},  # input_schema missing
        {"name": "t", "input_schema": "a string"},
        {"name": "t", "input_schema": {"type": "objekt"}},
        {"name": "t", "input_schema": {"type": "array"}},  # Anthropic wants an object schema
        {"name": "my tool!", "input_schema": {"type": "object"}},
    ]
    for tool in bad_anthropic:
        with pytest.raises(anthropic.BadRequestError) as aexc:
            await ant.messages.create(model=M, max_tokens=2, messages=[{"role": "user", "content": "hi"}], tools=[tool])
        assert aexc.value.body["error"]["type"] == "invalid_request_error", tool  # type: ignore[index]
    # Two tools of one name: a call of it could not be told apart. Refused in each dialect, naming the second.
    with pytest.raises(openai.BadRequestError) as exc:
        await oai.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "hi"}], tools=[OAI_TOOLS[0], OAI_TOOLS[0]], max_tokens=2
        )
    assert exc.value.param == "tools[1].function.name" and "unique" in exc.value.message
    with pytest.raises(openai.BadRequestError) as exc:
        twice = {"type": "function", "name": "bash", "parameters": {"type": "object"}}
        await oai.responses.create(model=M, input="hi", tools=[twice, twice], max_output_tokens=2)  # type: ignore[list-item]
    assert exc.value.param == "tools[1].name"
    ant_tool: Any = {"name": "bash", "input_schema": {"type": "object"}}
    with pytest.raises(anthropic.BadRequestError) as aexc:
        await ant.messages.create(
            model=M, max_tokens=2, messages=[{"role": "user", "content": "hi"}], tools=[ant_tool, ant_tool]
        )
    assert "tools.1.name" in aexc.value.message and "unique" in aexc.value.message
    # A good definition still goes through, so the refusals above were about the definitions.
    await oai.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "hi"}], tools=OAI_TOOLS, max_tokens=2
    )
    recorded = await stack.recorded_as_stored()
    assert len(recorded) == 1


async def test_top_logprobs_give_k_alternatives_per_token(stack: Stack) -> None:
    oai = stack.openai("ex-top")
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    r = await oai.chat.completions.create(model=M, messages=msgs, max_tokens=6, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content and len(content) == r.usage.completion_tokens  # type: ignore[union-attr]
    for tok in content:
        lps = [t.logprob for t in tok.top_logprobs]
        assert len(lps) == 3 and lps == sorted(lps, reverse=True) and tok.logprob <= lps[0] + 1e-6
    stream = await oai.chat.completions.create(
        model=M, messages=msgs, max_tokens=6, logprobs=True, top_logprobs=3, stream=True
    )
    streamed = [
        t async for ch in stream if ch.choices and ch.choices[0].logprobs for t in ch.choices[0].logprobs.content or []
    ]
    assert streamed and all(len(t.top_logprobs) == 3 for t in streamed)
    legacy = await oai.completions.create(model=M, prompt="Once", max_tokens=5, logprobs=3)
    tops = legacy.choices[0].logprobs.top_logprobs  # type: ignore[union-attr]
    chosen = legacy.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert tops and len(tops) == 5
    # The 3 most likely tokens, and the chosen one (OpenAI's legacy shape): 3 or 4 entries, chosen among them.
    assert all(3 <= len(alt) <= 4 and tok in alt for alt, tok in zip(tops, chosen, strict=True))
    events = await stack.assert_recorded_matches_engines()
    assert len(events) == 3


async def test_forced_tool_calls_are_generated_under_the_tools_schema(stack: Stack) -> None:
    oai = stack.openai("ex-forced")
    msgs: list[Any] = [{"role": "user", "content": "weather in Oslo?"}]
    named = await oai.chat.completions.create(
        model=M,
        messages=msgs,
        tools=OAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "weather"}},
        parallel_tool_calls=False,
        max_tokens=200,
    )
    calls = named.choices[0].message.tool_calls
    assert named.choices[0].finish_reason == "tool_calls" and calls and len(calls) == 1
    assert calls[0].function.name == "weather"  # type: ignore[union-attr]
    jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER)  # type: ignore[union-attr]
    stream = await oai.chat.completions.create(
        model=M, messages=msgs, tools=OAI_TOOLS, tool_choice="required", max_tokens=300, stream=True
    )
    names = [d.function.name async for ch in stream for d in ch.choices[0].delta.tool_calls or [] if d.function]
    assert names and all(n in ("weather", "bash") for n in names if n)
    ant = stack.anthropic("ex-forced-ant")
    a_tools: list[Any] = [
        {"name": "weather", "input_schema": WEATHER},
        {"name": "bash", "input_schema": {"type": "object", "properties": {}}},
    ]
    m = await ant.messages.create(
        model=M,
        max_tokens=400,
        messages=msgs,
        tools=a_tools,
        tool_choice={"type": "tool", "name": "weather", "disable_parallel_tool_use": True},
    )
    uses = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and uses and uses[0].name == "weather"
    jsonschema.validate(uses[0].input, WEATHER)
    m2 = await ant.messages.create(model=M, max_tokens=400, messages=msgs, tools=a_tools, tool_choice={"type": "any"})
    assert m2.stop_reason == "tool_use"
    events = await stack.assert_recorded_matches_engines()
    assert events[0].tool_calls[0].name == "weather" and events[0].finish_reason == "tool_calls"
    with pytest.raises(openai.BadRequestError):  # naming a tool that is not there
        await oai.chat.completions.create(
            model=M, messages=msgs, tools=OAI_TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}
        )


async def test_tool_choice_none_keeps_a_tool_policy_from_calling(tool_stack: Stack) -> None:
    oai = tool_stack.openai("ex-none")
    msgs: list[Any] = conversation(0)
    auto = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=60, temperature=0)  # type: ignore[arg-type]
    assert auto.choices[0].message.tool_calls  # the policy calls a tool when it may
    none = await oai.chat.completions.create(
        model=M,
        messages=msgs,
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
        max_tokens=60,
        temperature=0,
    )
    assert not none.choices[0].message.tool_calls and none.choices[0].finish_reason != "tool_calls"
    tool_start = tool_stack.gateway.codec.tool_start
    events = await tool_stack.assert_recorded_matches_engines()
    assert tool_start not in events[1].output_ids


async def test_stop_strings_match_decoded_text_only(tool_stack: Stack) -> None:
    """``<tool_call>`` is one special token: a stop string spelled inside it must not end the turn there."""
    oai = tool_stack.openai("ex-stop")
    r = await oai.chat.completions.create(
        model=M,
        messages=conversation(0),  # type: ignore[arg-type]
        tools=TOOLS,  # type: ignore[arg-type]
        max_tokens=80,
        temperature=0,
        stop=["tool_call", "<"],
    )
    assert r.choices[0].finish_reason == "tool_calls" and r.choices[0].message.tool_calls


async def test_json_schema_response_format_gives_json_that_parses(stack: Stack) -> None:
    oai = stack.openai("ex-json")
    msgs: list[Any] = [{"role": "user", "content": "weather as JSON"}]
    r = await oai.chat.completions.create(
        model=M,
        messages=msgs,
        max_tokens=200,
        response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": WEATHER}},
    )
    jsonschema.validate(json.loads(r.choices[0].message.content or ""), WEATHER)
    stream = await oai.chat.completions.create(
        model=M, messages=msgs, max_tokens=300, response_format={"type": "json_object"}, stream=True
    )
    text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    assert isinstance(json.loads(text), dict)
    with pytest.raises(openai.BadRequestError):  # a schema keyword decoding cannot enforce: refused, not ignored
        await oai.chat.completions.create(
            model=M,
            messages=msgs,
            max_tokens=20,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "p", "schema": {"type": "string", "pattern": "a+"}},
            },
        )
    assert len(await stack.recorded_as_stored()) == 2


async def test_anthropic_thinking_is_refused_not_ignored(stack: Stack) -> None:
    ant = stack.anthropic("ex-think")
    with pytest.raises(anthropic.BadRequestError):
        await ant.messages.create(
            model=M,
            max_tokens=2048,
            messages=[{"role": "user", "content": "hi"}],
            thinking={"type": "enabled", "budget_tokens": 1024},
        )
    await ant.messages.create(
        model=M, max_tokens=4, messages=[{"role": "user", "content": "hi"}], thinking={"type": "disabled"}
    )
    assert len(await stack.recorded_as_stored()) == 1


@pytest.fixture
async def small_engine_stack(event_log: EventLog) -> AsyncIterator[Stack]:
    async with EngineServer(EngineConfig(port=0, context_length=64)) as srv:
        s = await make_stack(event_log, {"small": srv})
        yield s
        await s.gateway.stop()


async def test_an_engine_with_less_context_is_learned_and_refused_before_streaming(small_engine_stack: Stack) -> None:
    st = small_engine_stack
    assert st.gateway.context_length > 64 and st.gateway.effective_context() == 64
    long: list[Any] = [{"role": "user", "content": "x" * 200}]
    oai = st.openai("ex-ctx")
    with pytest.raises(openai.BadRequestError) as exc:
        await oai.chat.completions.create(model=M, messages=long, max_tokens=4, stream=True)
    assert exc.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as exc:  # fits alone, not with max_tokens: OpenAI says 400 too
        await oai.chat.completions.create(model=M, messages=[{"role": "user", "content": "hi"}], max_tokens=60)
    assert exc.value.code == "context_length_exceeded"
    ant = st.anthropic("ex-ctx")
    with pytest.raises(anthropic.BadRequestError) as aexc:
        async with ant.messages.stream(model=M, max_tokens=4, messages=long) as s:
            await s.get_final_message()
    assert aexc.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert await st.recorded_as_stored() == []


async def test_message_start_and_delta_agree_and_unknown_routes_answer_json(stack: Stack) -> None:
    ant = stack.anthropic("ex-usage")
    async with ant.messages.stream(model=M, max_tokens=6, messages=[{"role": "user", "content": "hi"}]) as s:
        starts = [ev.message.usage.input_tokens async for ev in s if ev.type == "message_start"]
        final = await s.get_final_message()
    assert starts == [final.usage.input_tokens]
    gw = stack.gateway
    key = {"authorization": f"Bearer {gw.issue_key('ex-usage')}"}
    async with httpx.AsyncClient() as http:
        r = await http.post(f"{gw.url}/x/ex-usage/v1/nope", headers=key, json={})
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error"
        r = await http.get(f"{gw.url}/x/ex-usage/v1/messages", headers={**key, "anthropic-version": "2023-06-01"})
        assert r.status_code == 405 and r.json()["type"] == "error"
        # The two APIs share /v1: an Anthropic client (its key header, or its version header) gets its own shape.
        for headers in ({"x-api-key": gw.issue_key("ex-usage")}, {**key, "anthropic-version": "2023-06-01"}):
            r = await http.post(f"{gw.url}/v1/messages/nope", headers=headers, json={})
            assert r.status_code == 404 and r.json()["type"] == "error", r.text
            assert r.json()["error"]["type"] == "not_found_error"
            r = await http.get(f"{gw.url}/v1/models/nope", headers=headers)
            assert r.status_code == 404 and r.json()["type"] == "error", r.text


async def test_the_httpx_engine_transport_records_the_same_calls(event_log: EventLog, engine_a: EngineServer) -> None:
    """The benchmark's baseline transport is a working engine client, not a stub (streamed and not)."""
    st = await make_stack(event_log, {"e0": engine_a}, engine_transport="httpx")
    try:
        oai = st.openai("ex-httpx")
        msgs: list[Any] = [{"role": "user", "content": "hi"}]
        await oai.chat.completions.create(model=M, messages=msgs, max_tokens=6)
        stream = await oai.chat.completions.create(model=M, messages=msgs, max_tokens=6, stream=True)
        assert [ch async for ch in stream]
        events = await st.assert_recorded_matches_engines()
        assert len(events) == 2
    finally:
        await st.gateway.stop()


async def test_n_samples_are_recorded_as_sibling_branches(stack: Stack) -> None:
    oai = stack.openai("ex-n")
    msgs: list[Any] = [{"role": "user", "content": "hi"}]
    r0 = await oai.chat.completions.create(model=M, messages=msgs, max_tokens=4)
    msgs += [{"role": "assistant", "content": r0.choices[0].message.content or ""}, {"role": "user", "content": "go"}]
    r1 = await oai.chat.completions.create(model=M, messages=msgs, max_tokens=6, n=3)
    assert [c.index for c in r1.choices] == [0, 1, 2]
    stream = await oai.chat.completions.create(
        model=M, messages=msgs, max_tokens=6, n=3, stream=True, stream_options={"include_usage": True}
    )
    finishes: dict[int, str] = {}
    usage = None
    async for ch in stream:
        for c in ch.choices:
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
        usage = ch.usage or usage
    assert sorted(finishes) == [0, 1, 2]
    legacy = await oai.completions.create(model=M, prompt="Once", max_tokens=4, n=2)
    assert [c.index for c in legacy.choices] == [0, 1]
    events = await stack.assert_recorded_matches_engines()
    assert len(events) == 1 + 3 + 3 + 2
    samples = events[1:7]
    # Every sample is a call of its own, a child of the first call: six branches under one parent.
    assert len({e.call_id for e in samples}) == 6 and {e.parent_call_id for e in samples} == {events[0].call_id}
    assert usage is not None and usage.completion_tokens == sum(len(e.output_ids) for e in events[4:7])
    assert r1.usage is not None and r1.usage.completion_tokens == sum(len(e.output_ids) for e in events[1:4])
