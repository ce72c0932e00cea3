"""The gateway with the official SDKs as clients and the real CPU engine behind it.

The TITO guarantee is checked against the engine's own request log for every call: what was recorded is
token for token what the engine consumed and produced (plain, streamed, tool calls, branches, retries).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from opengyre.config import HttpLimits
from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog
from opengyre.trajectory import TrajectoryTree
from opengyre.wire import Outcome, assemble

from .._polling import await_until
from ._policy import SYSTEM, TOOL_OUTPUT, TOOLS, USER, conversation
from .conftest import Stack, make_stack

M = "opengyre-tiny"


async def test_openai_chat_and_completions_record_what_the_engine_saw(stack: Stack) -> None:
    client = stack.openai("ex-oai")
    m1: list[Any] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    r1 = await client.chat.completions.create(model=M, messages=m1, max_tokens=8)
    assert r1.usage is not None and r1.usage.prompt_tokens == len(stack.gateway.codec.render_ids(m1))
    assert r1.usage.completion_tokens == len(stack.engine_records(r1.id.removeprefix("chatcmpl-"))[0].output_ids)
    m2 = [*m1, {"role": "assistant", "content": r1.choices[0].message.content or ""}, {"role": "user", "content": "go"}]
    stream = await client.chat.completions.create(
        model=M, messages=m2, max_tokens=12, stream=True, stream_options={"include_usage": True}
    )
    text, finish, usage = "", None, None
    async for ch in stream:
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
        usage = ch.usage or usage
    r3 = await client.completions.create(model=M, prompt="Once upon a time", max_tokens=5)
    r4 = await client.completions.create(model=M, prompt=[257, 10, 65, 66], max_tokens=4)
    events = await stack.assert_recorded_matches_engines()
    assert [e.branch for e in events] == ["root", "extension", "root", "root"]
    assert events[1].parent_call_id == events[0].call_id and events[1].dialect == "openai-chat"
    assert usage is not None and usage.completion_tokens == len(events[1].output_ids)
    assert finish in ("stop", "length") and text == assemble(stack.gateway.codec, _outcome(events[1])).content
    assert r3.choices[0].text == stack.gateway.codec.decode(events[2].output_ids)
    assert r4.usage is not None and r4.usage.prompt_tokens == 4
    assert all(e.weight_version == "default" and e.engine_id == "e0" for e in events)


def _outcome(e: Any) -> Outcome:
    kind = "length" if e.finish_reason == "length" else "stop"
    fin = {"type": kind, "length": len(e.output_ids)} if kind == "length" else {"type": "stop", "matched": None}
    return Outcome(output_ids=list(e.output_ids), finish=fin)


async def test_anthropic_messages_streamed_and_not_record_what_the_engine_saw(stack: Stack) -> None:
    client = stack.anthropic("ex-ant")
    msgs: list[Any] = [{"role": "user", "content": "hello"}]
    r1 = await client.messages.create(model=M, max_tokens=10, system="terse", messages=msgs)
    assert r1.type == "message" and r1.stop_reason in ("end_turn", "max_tokens")
    text = "".join(b.text for b in r1.content if b.type == "text")
    msgs2 = [
        *msgs,
        {"role": "assistant", "content": [{"type": "text", "text": text}] if text else "..."},
        {"role": "user", "content": [{"type": "text", "text": "and?"}]},
    ]
    counted = await client.messages.count_tokens(model=M, system="terse", messages=msgs2)
    async with client.messages.stream(model=M, max_tokens=10, system="terse", messages=msgs2) as s:
        events_seen = [ev.type async for ev in s]
        final = await s.get_final_message()
    assert events_seen[0] == "message_start" and "message_stop" in events_seen
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == counted.input_tokens
    events = await stack.assert_recorded_matches_engines()
    assert [e.dialect for e in events] == ["anthropic", "anthropic"]
    assert final.usage.output_tokens == len(events[1].output_ids)
    if text:  # a faithful echo of the reply extends it at the token level
        assert events[1].branch == "extension" and events[1].parent_call_id == events[0].call_id


async def test_tool_calls_in_both_dialects(tool_stack: Stack) -> None:
    st = tool_stack
    oai = st.openai("ex-tools-oai")
    msgs: list[Any] = conversation(0)
    r1 = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
    choice = r1.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
    tc = choice.message.tool_calls[0]
    assert tc.type == "function" and (tc.function.name, tc.function.arguments) == ("bash", '{"cmd": "ls"}')
    msgs += [
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": TOOL_OUTPUT},
    ]
    stream = await oai.chat.completions.create(
        model=M,
        messages=msgs,
        tools=TOOLS,
        max_tokens=80,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    calls: dict[int, dict[str, str]] = {}
    finish = None
    async for ch in stream:
        for d in ch.choices[0].delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": "", "name": "", "args": ""})
            c["id"] = d.id or c["id"]
            c["name"] = (d.function.name if d.function else None) or c["name"]
            c["args"] += (d.function.arguments if d.function else None) or ""
        finish = ch.choices[0].finish_reason or finish
    assert finish == "tool_calls" and calls[0]["name"] == "bash" and calls[0]["args"] == '{"cmd": "ls"}'

    ant = st.anthropic("ex-tools-ant")
    a_tools: list[Any] = [{"name": "bash", "description": "run a command", "input_schema": {"type": "object"}}]
    a_msgs: list[Any] = [{"role": "user", "content": USER}]
    m1 = await ant.messages.create(
        model=M, max_tokens=80, system=SYSTEM, tools=a_tools, messages=a_msgs, extra_body={"temperature": 0}
    )
    use = [b for b in m1.content if b.type == "tool_use"]
    assert m1.stop_reason == "tool_use" and use and use[0].name == "bash" and use[0].input == {"cmd": "ls"}
    a_msgs += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in m1.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use[0].id, "content": TOOL_OUTPUT}]},
    ]
    async with ant.messages.stream(
        model=M, max_tokens=80, system=SYSTEM, tools=a_tools, messages=a_msgs, extra_body={"temperature": 0}
    ) as s:
        m2 = await s.get_final_message()
    assert m2.stop_reason == "tool_use" and [b.input for b in m2.content if b.type == "tool_use"] == [{"cmd": "ls"}]

    events = await st.assert_recorded_matches_engines()
    assert [e.branch for e in events] == ["root", "extension", "root", "extension"]
    assert all(e.drift is None for e in events), [e.drift for e in events]  # faithful history: no drift
    assert [(t.id, t.name, t.arguments) for t in events[0].tool_calls] == [(tc.id, "bash", '{"cmd": "ls"}')]
    assert events[1].tool_calls[0].id == calls[0]["id"]
    assert events[2].tool_calls[0].id == use[0].id and events[2].finish_reason == "tool_calls"


async def test_a_harness_that_reformats_tool_arguments_is_recorded_as_drift(tool_stack: Stack) -> None:
    oai = tool_stack.openai("ex-drift")
    msgs: list[Any] = conversation(0)
    r1 = await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
    tc = r1.choices[0].message.tool_calls[0]  # type: ignore[index]
    edited = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": tc.id, "type": "function", "function": {"name": "bash", "arguments": '{"cmd":"ls"}'}}],
    }
    msgs += [edited, {"role": "tool", "tool_call_id": tc.id, "content": TOOL_OUTPUT}]
    await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
    events = await tool_stack.assert_recorded_matches_engines()
    second = events[1]
    assert second.branch == "extension" and second.drift is not None and second.drift.kind == "retokenization"
    # The policy is conditioned on its own emitted bytes, not on the harness's re-serialisation.
    tree = TrajectoryTree("ex-drift", events)
    prompt = tree.prompt(second.call_id)
    assert list(prompt[: len(tree.tokens(events[0].call_id))]) == list(tree.tokens(events[0].call_id))


async def test_retry_subagent_and_compaction_branch_the_tree(stack: Stack) -> None:
    main = stack.openai("ex-tree")
    m1: list[Any] = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "build it"}]
    r1 = await main.chat.completions.create(model=M, messages=m1, max_tokens=6)
    m2 = [
        *m1,
        {"role": "assistant", "content": r1.choices[0].message.content or ""},
        {"role": "user", "content": "continue"},
    ]
    await main.chat.completions.create(model=M, messages=m2, max_tokens=6)
    await main.chat.completions.create(model=M, messages=m2, max_tokens=6)  # the harness retries
    sub = stack.openai("ex-tree", role="sub-agent")
    await sub.chat.completions.create(
        model=M,
        messages=[{"role": "system", "content": "sub agent"}, {"role": "user", "content": "search"}],
        max_tokens=6,
    )
    summary = await main.chat.completions.create(
        model=M,
        messages=[*m2, {"role": "user", "content": "Summarize the conversation."}],
        max_tokens=6,
        extra_headers={"x-opengyre-role": "main-summary"},
    )
    compacted = [
        {"role": "system", "content": "main agent"},
        {"role": "user", "content": f"Summary: {summary.choices[0].message.content}"},
    ]
    await main.chat.completions.create(model=M, messages=compacted, max_tokens=6)
    events = await stack.assert_recorded_matches_engines()
    assert [e.branch for e in events] == ["root", "extension", "retry", "root", "extension", "root"]
    assert [e.role for e in events] == ["main", "main", "main", "sub-agent", "main-summary", "main"]
    c = [e.call_id for e in events]
    tree = TrajectoryTree("ex-tree", events)
    assert tree.node(c[2]).parent_call_id == c[0]  # the retry is a sibling of the call it repeats
    assert sorted(tree.leaves()) == sorted(c[1:])
    # The summary request repeats call 2's request plus a turn: it forks inside call 2's prompt, so it hangs off
    # call 1 (whose reply it does contain), a sibling of call 2.
    assert tree.node(c[4]).parent_call_id == c[0]
    assert sorted(tree.roots()) == sorted([c[0], c[3], c[5]])
    p = tree.path_sequence(c[4])
    assert p.role == "main-summary" and sum(p.generated) == sum(len(events[i].output_ids) for i in (0, 4))


@pytest.fixture
async def strict_stack(event_log: EventLog, engine_a: EngineServer) -> Any:
    s = await make_stack(event_log, {"e0": engine_a}, http=HttpLimits(max_body_bytes=4096), context_length=256)
    yield s
    await s.gateway.stop()


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_rejected_calls_get_the_dialects_errors_and_record_nothing(strict_stack: Stack, dialect: str) -> None:
    st = strict_stack
    gw = st.gateway
    good = gw.issue_key("ex-a")
    if dialect == "openai":
        url = f"{gw.base_url('ex-a')}/chat/completions"
        body: dict[str, Any] = {"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def err_type(r: httpx.Response) -> str:
            return str(r.json()["error"]["type"])

        def auth(k: str) -> dict[str, str]:
            return {"authorization": f"Bearer {k}"}
    else:
        url = f"{gw.url}/x/ex-a/v1/messages"
        body = {"model": M, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}

        def err_type(r: httpx.Response) -> str:
            assert r.json()["type"] == "error"
            return str(r.json()["error"]["type"])

        def auth(k: str) -> dict[str, str]:
            return {"x-api-key": k, "anthropic-version": "2023-06-01"}

    async with httpx.AsyncClient() as c:
        r = await c.post(url, content=b"{oops", headers={**auth(good), "content-type": "application/json"})
        assert r.status_code == 400 and err_type(r) == "invalid_request_error"
        r = await c.post(url, json=body)
        assert r.status_code == 401 and err_type(r) == "authentication_error"
    if dialect == "openai":
        ok = st.openai("ex-a")
        with pytest.raises(openai.NotFoundError) as nf:
            await ok.chat.completions.create(model="gpt-9", messages=[{"role": "user", "content": "x"}])
        assert nf.value.code == "model_not_found"
        with pytest.raises(openai.AuthenticationError):
            await openai.AsyncOpenAI(
                base_url=gw.base_url("ex-a"), api_key="og1.ex-a.main.0000", max_retries=0
            ).chat.completions.create(model=M, messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.PermissionDeniedError):
            await openai.AsyncOpenAI(
                base_url=gw.base_url("ex-a"), api_key=gw.issue_key("ex-b"), max_retries=0
            ).chat.completions.create(model=M, messages=[{"role": "user", "content": "x"}])
        with pytest.raises(openai.APIStatusError) as big:
            await ok.chat.completions.create(model=M, messages=[{"role": "user", "content": "x" * 5000}])
        assert big.value.status_code == 413
        with pytest.raises(openai.BadRequestError) as ctx:
            await ok.chat.completions.create(model=M, messages=[{"role": "user", "content": "y" * 300}])
        assert ctx.value.code == "context_length_exceeded"
    else:
        ok_a = st.anthropic("ex-a")
        msgs: Any = [{"role": "user", "content": "x"}]
        with pytest.raises(anthropic.NotFoundError):
            await ok_a.messages.create(model="claude-nope", max_tokens=4, messages=msgs)
        with pytest.raises(anthropic.AuthenticationError):
            await anthropic.AsyncAnthropic(base_url=f"{gw.url}/x/ex-a", api_key="nope", max_retries=0).messages.create(
                model=M, max_tokens=4, messages=msgs
            )
        with pytest.raises(anthropic.PermissionDeniedError):
            await anthropic.AsyncAnthropic(
                base_url=f"{gw.url}/x/ex-a", api_key=gw.issue_key("ex-b"), max_retries=0
            ).messages.create(model=M, max_tokens=4, messages=msgs)
        with pytest.raises(anthropic.RequestTooLargeError) as big_a:
            await ok_a.messages.create(model=M, max_tokens=4, messages=[{"role": "user", "content": "x" * 5000}])
        assert big_a.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]
        with pytest.raises(anthropic.BadRequestError) as long_a:
            await ok_a.messages.create(model=M, max_tokens=4, messages=[{"role": "user", "content": "y" * 300}])
        assert "prompt is too long" in str(long_a.value)
    assert await st.recorded() == []
    assert st.engines["e0"].engine.request_log() == []
    # The 413 came from the HTTP server (before the body was read): counted by reason on /metrics.
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(f"{gw.url}/metrics")).text
    assert 'opengyre_proxy_http_refused_total{reason="body_too_large"} 1.0' in metrics


async def test_no_capacity_means_a_bounded_wait_then_429_with_retry_after(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    st = await make_stack(event_log, {}, queue_timeout_s=0.3, max_queue=1, retry_after_s=3)
    try:
        oai = st.openai("ex-q")
        msgs: Any = [{"role": "user", "content": "x"}]
        with pytest.raises(openai.RateLimitError) as rl:
            await oai.chat.completions.create(model=M, messages=msgs, max_tokens=2)
        assert rl.value.response.headers["retry-after"] == "3"
        with pytest.raises(anthropic.RateLimitError):
            await st.anthropic("ex-q").messages.create(model=M, max_tokens=2, messages=msgs)
        # A request waiting in the queue is served as soon as an engine arrives.
        st.gateway.pool.queue_timeout_s = 30
        waiting = asyncio.create_task(oai.chat.completions.create(model=M, messages=msgs, max_tokens=2))
        await await_until(
            lambda: st.gateway.pool.waiting != 0,
            "a request waits for capacity",
            polls=12000,
            every=0.01,
        )
        with pytest.raises(openai.RateLimitError):  # the queue (of one) is full: refused at once
            await oai.chat.completions.create(model=M, messages=msgs, max_tokens=2)
        await st.gateway.pool.add("late", engine_a.url)
        st.engines["late"] = engine_a
        assert (await waiting).choices[0].finish_reason in ("stop", "length")
        events = await st.assert_recorded_matches_engines()
        assert len(events) == 1 and events[0].timings.queued_ms > 0
        async with httpx.AsyncClient() as c:
            text = (await c.get(st.gateway.url + "/metrics")).text
        assert 'opengyre_proxy_rejected_total{status="429"} 3.0' in text
        assert "opengyre_proxy_calls_total 1.0" in text and "opengyre_proxy_recorded_total 1.0" in text
    finally:
        await st.gateway.stop()


async def test_a_call_whose_execution_was_evicted_meanwhile_is_still_recorded_in_place(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a}, max_executions=1)
    try:
        oai = st.openai("ex-evicted")
        m1: list[Any] = [{"role": "user", "content": "x"}]
        r1 = await oai.chat.completions.create(model=M, messages=m1, max_tokens=3)
        m2 = [
            *m1,
            {"role": "assistant", "content": r1.choices[0].message.content or ""},
            {"role": "user", "content": "y"},
        ]
        await st.gateway.pool.drain("e0")  # no engine: the next calls wait in the queue after planning
        second = asyncio.create_task(oai.chat.completions.create(model=M, messages=m2, max_tokens=3))
        await await_until(
            lambda: st.gateway.pool.waiting >= 1,
            "a request waits for capacity",
            polls=12000,
            every=0.01,
        )
        other = asyncio.create_task(st.openai("ex-other").chat.completions.create(model=M, messages=m1, max_tokens=3))
        await await_until(
            lambda: st.gateway.pool.waiting >= 2,
            "planned too: its execution took the only live slot",
            polls=12000,
            every=0.01,
        )
        await st.gateway.pool.add("e0", engine_a.url)
        await asyncio.gather(second, other)
        events = await st.assert_recorded_matches_engines()
        ext = next(e for e in events if e.execution_id == "ex-evicted" and e.parent_call_id is not None)
        assert ext.branch == "extension" and ext.parent_call_id == events[0].call_id
    finally:
        await st.gateway.stop()


async def test_stop_sequences_and_logprobs_reach_the_harness_and_the_record(tool_stack: Stack) -> None:
    st = tool_stack
    oai = st.openai("ex-stop")
    msgs: list[Any] = conversation(0)
    r = await oai.chat.completions.create(
        model=M,
        messages=msgs,
        tools=TOOLS,
        max_tokens=80,
        temperature=0,
        stop=["bash"],
        logprobs=True,  # type: ignore[arg-type]
    )
    ch = r.choices[0]
    assert ch.finish_reason == "stop" and ch.message.content == '{"name": "' and not ch.message.tool_calls
    assert ch.logprobs is not None and ch.logprobs.content is not None
    ant = st.anthropic("ex-stop-a")
    m = await ant.messages.create(
        model=M,
        max_tokens=80,
        system=SYSTEM,
        messages=[{"role": "user", "content": USER}],
        tools=[{"name": "bash", "description": "run a command", "input_schema": {"type": "object"}}],
        stop_sequences=["bash"],
        extra_body={"temperature": 0},
    )
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "bash"
    events = await st.assert_recorded_matches_engines()
    assert [lp.logprob for lp in ch.logprobs.content] == list(events[0].output_logprobs)
    # The policy's tokens include the stop string; the next turn extends them and closes the turn with eos.
    msgs += [{"role": "assistant", "content": ch.message.content}, {"role": "user", "content": "go on"}]
    await oai.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    events = await st.assert_recorded_matches_engines()
    third = events[2]
    codec = st.gateway.codec
    assert third.branch == "extension" and third.parent_call_id == events[0].call_id
    assert third.prompt_delta_ids[0] == codec.eos_id
    assert codec.decode(events[0].output_ids, skip_special=False).endswith("bash")


def test_an_empty_stop_string_is_no_stop_in_either_form() -> None:
    from opengyre.wire import openai as _openai

    chat = {"model": M, "messages": [{"role": "user", "content": "x"}]}
    for stop, expected in (("", []), ([""], []), (["", "x"], ["x"])):
        assert _openai.parse_chat({**chat, "stop": stop}).stop == expected, stop
        assert _openai.parse_completion({"model": M, "prompt": "x", "stop": stop}).stop == expected, stop


async def test_weights_reloaded_mid_call_are_recorded_per_token(stack: Stack, tmp_path: Any) -> None:
    from opengyre.models import build_model, model_config, save_checkpoint

    save_checkpoint(build_model(model_config("tiny"), seed=5), tmp_path / "v2", "v2")
    engine = stack.engines["e0"]
    stream = await stack.openai("ex-wv").chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=1500,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    n = 0
    async for _ in stream:
        n += 1
        if n == 10:
            async with httpx.AsyncClient() as c:
                r = await c.post(engine.url + "/update_weights_from_disk", json={"model_path": str(tmp_path / "v2")})
                assert r.json()["success"] is True
    events = await stack.assert_recorded_matches_engines()
    e = events[0]
    spans = [(w.version, w.start, w.end) for w in e.weight_versions]
    assert e.weight_version == "v2" and len(spans) == 2
    assert spans[0][0] == "default" and spans[1] == ("v2", spans[0][2], 1500) and spans[0][1] == 0
    p = TrajectoryTree("ex-wv", events).path_sequence(e.call_id)
    gen = [v for v, g in zip(p.weight_versions, p.generated, strict=True) if g]
    assert gen == ["default"] * spans[0][2] + ["v2"] * (1500 - spans[0][2])


async def test_sub_agents_behind_one_key_are_told_apart(stack: Stack) -> None:
    client = stack.openai("ex-infer")  # one key for everything, as Claude Code uses it
    main: list[Any] = [{"role": "system", "content": "main agent"}, {"role": "user", "content": "build"}]
    r1 = await client.chat.completions.create(model=M, messages=main, max_tokens=4)
    sub: list[Any] = [{"role": "system", "content": "you are a search sub-agent"}, {"role": "user", "content": "find"}]
    s1 = await client.chat.completions.create(model=M, messages=sub, max_tokens=4)
    sub2 = [
        *sub,
        {"role": "assistant", "content": s1.choices[0].message.content or ""},
        {"role": "user", "content": "deeper"},
    ]
    await client.chat.completions.create(model=M, messages=sub2, max_tokens=4)
    main2 = [
        *main,
        {"role": "assistant", "content": r1.choices[0].message.content or ""},
        {"role": "user", "content": "next"},
    ]
    await client.chat.completions.create(model=M, messages=main2, max_tokens=4)
    compacted = [main[0], {"role": "user", "content": "Summary: built it."}]
    await client.chat.completions.create(model=M, messages=compacted, max_tokens=4)
    events = await stack.assert_recorded_matches_engines()
    assert [e.role for e in events] == ["main", "sub-agent", "sub-agent", "main", "main"]
    assert [e.branch for e in events] == ["root", "root", "extension", "extension", "root"]


@pytest.mark.parametrize("dialect", ["openai", "anthropic"])
async def test_hostile_bodies_get_the_dialects_400_and_record_nothing(stack: Stack, dialect: str) -> None:
    """A body nested 10,000 arrays deep (the JSON decoder's recursion) and token ids no vocabulary has (2**31 and
    past: an engine's int32) are the caller's errors, in the dialect's shape, never a 500 or a crash."""
    gw = stack.gateway
    key = gw.issue_key("ex-hostile")
    if dialect == "openai":
        url, headers = f"{gw.base_url('ex-hostile')}/chat/completions", {"authorization": f"Bearer {key}"}
    else:
        url, headers = f"{gw.url}/x/ex-hostile/v1/messages", {"x-api-key": key, "anthropic-version": "2023-06-01"}
    headers["content-type"] = "application/json"
    deep = b"[" * 10_000 + b"]" * 10_000
    nested_field = b'{"model": "%s", "max_tokens": 2, "messages": %s}' % (M.encode(), deep)
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(300):  # 600 levels of JSON: within the decoder's bound, past what a recursive check walks
        schema = {"type": "object", "properties": {"a": schema}}
    tool = (
        {"type": "function", "function": {"name": "f", "parameters": schema}}
        if dialect == "openai"
        else {"name": "f", "input_schema": schema}
    )
    msgs = [{"role": "user", "content": "x"}]
    deep_tool = json.dumps({"model": M, "max_tokens": 2, "messages": msgs, "tools": [tool]}).encode()
    async with httpx.AsyncClient(timeout=60) as c:
        for body in (deep, nested_field, deep_tool):
            r = await c.post(url, content=body, headers=headers)
            assert r.status_code == 400, r.text
            assert r.json()["error"]["type"] == "invalid_request_error"
            if dialect == "anthropic":
                assert r.json()["type"] == "error"
        if dialect == "openai":
            completions = f"{gw.base_url('ex-hostile')}/completions"
            for ids in ([2**31], [1, 2**31 + 7], [2**63], [2**64 + 1], [-1]):
                r = await c.post(completions, json={"model": M, "prompt": ids, "max_tokens": 2}, headers=headers)
                assert r.status_code == 400, (ids, r.text)
                assert r.json()["error"]["type"] == "invalid_request_error" and r.json()["error"]["param"] == "prompt"
            for field, value in (
                ("stop_token_ids", [2**31]),
                ("logit_bias", {str(2**31): 1}),
                ("logit_bias", {"x": 1}),
            ):
                chat = {"model": M, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2, field: value}
                r = await c.post(url, json=chat, headers=headers)
                assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
        # The gateway still answers, and nothing was recorded or sent to an engine.
        assert (await c.get(f"{gw.url}/health")).status_code == 200
    assert await stack.recorded() == []
    assert stack.engines["e0"].engine.request_log() == []
