"""The OpenAI Responses API through the gateway, with the official ``openai`` SDK over real HTTP."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

from .conftest import Stack

M = "opengyre-tiny"
WEATHER: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
}
TOOLS: list[Any] = [{"type": "function", "name": "weather", "description": "forecast", "parameters": WEATHER}]


async def test_responses_plain_streamed_and_chained_by_previous_response_id(stack: Stack) -> None:
    client = stack.openai("ex-resp")
    r1 = await client.responses.create(model=M, instructions="be brief", input="hi", max_output_tokens=8)
    assert r1.object == "response" and r1.status in ("completed", "incomplete") and r1.id.startswith("resp_")
    assert r1.usage is not None and r1.usage.output_tokens == len(stack.engine_records(r1.id[5:])[0].output_ids)
    stream = await client.responses.create(
        model=M, instructions="be brief", input="go on", previous_response_id=r1.id, max_output_tokens=8, stream=True
    )
    seen = [ev async for ev in stream]
    types = [ev.type for ev in seen]
    # At the length limit the terminal event is response.incomplete (as OpenAI streams it), else completed.
    r2 = seen[-1].response  # type: ignore[union-attr]
    assert r2.previous_response_id == r1.id and [ev.sequence_number for ev in seen] == list(range(len(seen)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] in ("response.completed", "response.incomplete")
    if r2.output_text:  # a message item opens with its part and closes in order
        i = types.index("response.output_item.added")
        assert types[i + 1] == "response.content_part.added" and "response.output_text.delta" in types
        tail = [t for t in types if t.endswith(".done")]
        assert tail == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    # An unknown previous response is the dialect's 400 and records nothing more.
    with pytest.raises(openai.BadRequestError) as exc:
        await client.responses.create(model=M, input="x", previous_response_id="resp_nope", max_output_tokens=4)
    assert exc.value.code == "previous_response_not_found"
    events = await stack.assert_recorded_matches_engines()
    assert [e.dialect for e in events] == ["openai-responses", "openai-responses"]
    # The chained call extends the first one's tokens (the same tree, one branch longer).
    assert events[1].parent_call_id == events[0].call_id and events[1].branch == "extension"


async def test_responses_function_calls_and_their_outputs(stack: Stack) -> None:
    client = stack.openai("ex-resp-tools")
    r1 = await client.responses.create(
        model=M,
        input=[{"role": "user", "content": "weather in Oslo?"}],
        tools=TOOLS,
        tool_choice={"type": "function", "name": "weather"},
        parallel_tool_calls=False,
        max_output_tokens=200,
    )
    calls = [o for o in r1.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER)
    # The harness sends the output items back with the tool's result: TITO extends the recorded call.
    items: list[Any] = [
        {"role": "user", "content": "weather in Oslo?"},
        *[o.model_dump(exclude_none=True) for o in r1.output],
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny"},
    ]
    stream = await client.responses.create(
        model=M,
        input=items,
        tools=TOOLS,
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=200,
        stream=True,
    )
    seen = [ev async for ev in stream]
    kinds = [ev.type for ev in seen]
    assert kinds[-1] == "response.completed"
    i = kinds.index("response.output_item.added")
    assert kinds[i : i + 4] == [
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
    ]
    done = seen[-1].response  # type: ignore[union-attr]
    assert [o.type for o in done.output] == ["function_call"] * len(done.output)
    events = await stack.assert_recorded_matches_engines()
    assert events[1].parent_call_id == events[0].call_id and events[1].branch == "extension"
    # A forced call is generated as SGLang's JSON array, which the chat template re-renders as a <tool_call>
    # block: recorded as retokenization drift, the prompt keeping the tokens the policy emitted.
    assert events[1].drift is not None and events[1].drift.kind == "retokenization"
    assert events[0].tool_calls[0].id == calls[0].call_id


async def test_responses_refuse_what_they_cannot_honour(stack: Stack) -> None:
    client = stack.openai("ex-resp-bad")
    bad: list[dict[str, Any]] = [
        {"tools": [{"type": "web_search"}]},
        {"tools": [{"type": "function", "name": "my tool!", "parameters": {"type": "object"}}]},
        {"reasoning": {"effort": "ultra"}},  # not an effort the API has (a real one is accepted, no effect)
        {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
        {"include": ["file_search_call.results"]},
        {"input": []},  # nothing to answer: no instructions, no previous response
    ]
    for extra in bad:
        kw: dict[str, Any] = {"model": M, "input": "hi", "max_output_tokens": 4, **extra}
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(**kw)
    with pytest.raises(openai.BadRequestError):  # past int64: the engine's generator cannot take it
        await client.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "hi"}], max_tokens=2, seed=2**64
        )
    r = await client.responses.create(
        model=M, input="hi", max_output_tokens=4, include=["message.output_text.logprobs"], top_logprobs=2
    )
    msgs = [o for o in r.output if o.type == "message"]
    for m in msgs:
        assert all(len(lp.top_logprobs) == 2 for lp in m.content[0].logprobs or [])  # type: ignore[union-attr]
    assert len(await stack.recorded_as_stored()) == 1
