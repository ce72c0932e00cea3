"""Requests recorded from the real harnesses (Claude Code 2.1.328, Codex 0.169.0, OpenCode 1.18.33, mini-swe-agent
2.4.6, the OpenAI Agents SDK 0.24.0; see
fixtures/harness_requests/README.md), replayed through the real gateway against a scripted SGLang-protocol
engine: each gets a valid answer in its dialect (checked with the vendor SDK's own types), what the model is
shown is what the harness sent, and the roles are what the conversations are."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pydantic
import pytest

from opengyre.asgi import HttpServer
from opengyre.eventlog import EventLog
from opengyre.proxy.recording._atif import export_execution
from opengyre.proxy.recording._trees import StoredCall
from opengyre.trajectory import TrajectoryTree

from ._scripted_sglang import scripted_sglang
from .conftest import Stack, make_stack
from .test_store import _check_atif

FIXTURES = Path(__file__).parent / "fixtures" / "harness_requests"
ENGINE_CONTEXT = 1 << 18  # above the shipped tokenizer's model_max_length (32,768): the engine's must win
MODELS = ("qwen3-8b", "gpt-5.5-codex")


def _fixtures(harness: str) -> list[Path]:
    return sorted((FIXTURES / harness).glob("*.json"))


def _load(p: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(p.read_text())
    return out


class Replay:
    def __init__(self, stack: Stack, prompts: list[str]) -> None:
        self.stack, self.prompts = stack, prompts
        self.reply = "fine"  # what the scripted model answers next

    async def post(self, path: str, body: dict[str, Any], *, anthropic_api: bool) -> httpx.Response:
        headers = {"anthropic-version": "2023-06-01"} if anthropic_api else {}
        return await self.send({"path": f"/v1{path}", "headers": headers, "body": body}, "ex-features")

    async def send(self, rec: dict[str, Any], execution_id: str) -> httpx.Response:
        key = self.stack.gateway.issue_key(execution_id)
        headers = {k: v for k, v in rec["headers"].items() if k not in ("x-api-key", "authorization")}
        headers["x-api-key" if "anthropic-version" in headers else "authorization"] = (
            key if "anthropic-version" in headers else f"Bearer {key}"
        )
        path = rec["path"].removeprefix("/v1")
        async with httpx.AsyncClient(timeout=60) as c:
            return await c.post(f"{self.stack.gateway.base_url(execution_id)}{path}", json=rec["body"], headers=headers)


@pytest.fixture
async def replay(event_log: EventLog) -> AsyncIterator[Replay]:
    holder: list[Replay] = []
    app, prompts = scripted_sglang(lambda _prompt: holder[0].reply, context_length=ENGINE_CONTEXT)
    engine = HttpServer(app)
    await engine.start()
    st = await make_stack(event_log, {}, models=MODELS)
    await st.gateway.pool.add("scripted", engine.url)
    holder.append(Replay(st, prompts))
    try:
        yield holder[0]
    finally:
        await st.gateway.stop()
        await engine.stop()


def _sse(text: str) -> list[tuple[str | None, Any]]:
    out: list[tuple[str | None, Any]] = []
    for block in text.split("\n\n"):
        name, data = None, None
        for line in block.splitlines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = line[6:]
        if data is not None:
            out.append((name, data if data == "[DONE]" else json.loads(data)))
    return out


_ANTHROPIC_EVENT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(anthropic.types.RawMessageStreamEvent)


def _valid_answer(rec: dict[str, Any], r: httpx.Response) -> str:
    """The answer's text, after checking it parses as the vendor SDK's types, end to end."""
    assert r.status_code == 200, r.text
    body, path = rec["body"], rec["path"]
    if not body.get("stream"):
        if path.startswith("/v1/messages"):
            return "".join(b.text for b in anthropic.types.Message.model_validate(r.json()).content if b.type == "text")
        if path.startswith("/v1/responses"):
            return openai.types.responses.Response.model_validate(r.json()).output_text
        return openai.types.chat.ChatCompletion.model_validate(r.json()).choices[0].message.content or ""
    events = _sse(r.text)
    if path.startswith("/v1/messages"):
        assert all(n == d["type"] for n, d in events), "every Anthropic event is named by its type"
        parsed = [_ANTHROPIC_EVENT.validate_python(d) for n, d in events if n != "ping"]  # the SDK skips ping
        assert parsed[0].type == "message_start" and parsed[-1].type == "message_stop", [p.type for p in parsed]
        return "".join(p.delta.text for p in parsed if p.type == "content_block_delta" and p.delta.type == "text_delta")
    if path.startswith("/v1/responses"):
        assert all(n == d["type"] for n, d in events), "every Responses event is named by its type"
        done = events[-1][1]
        assert done["type"] == "response.completed", done
        resp = openai.types.responses.Response.model_validate(done["response"])
        return resp.output_text
    assert events[-1][1] == "[DONE]"
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(d) for _, d in events[:-1]]
    return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)


@pytest.mark.parametrize("harness", ["claude-code", "codex", "opencode", "mini-swe-agent", "openai-agents"])
async def test_every_recorded_request_gets_a_valid_answer_in_its_dialect(replay: Replay, harness: str) -> None:
    files = _fixtures(harness)
    assert files, f"no fixtures for {harness}"
    answered = 0
    for i, p in enumerate(files):
        rec = _load(p)
        r = await replay.send(rec, f"ex-{harness}-{i}")
        hosted = [t["type"] for t in rec["body"].get("tools", []) if t.get("type") in ("web_search", "tool_search")]
        if hosted:  # Codex's defaults offer tools the vendor runs: refused, as docs/proxy.md says
            assert r.status_code == 400, p.name
            assert f"tool type {hosted[0]!r} is a hosted tool this server cannot run" in r.json()["error"]["message"]
            continue
        assert _valid_answer(rec, r) == "fine", p.name
        answered += 1
    assert answered >= 2
    events = await replay.stack.recorded()
    assert len(events) == answered  # every one answered was recorded, none twice


async def test_claude_code_is_shown_what_it_sent(replay: Replay) -> None:
    """System blocks as separate lines, its mid-conversation system turns where they stand, deferred tools held
    back, and what it asked for that has no effect here recorded as such."""
    rec = _load(FIXTURES / "claude-code" / "shell-002.json")
    r = await replay.send(rec, "ex-cc")
    assert r.status_code == 200, r.text
    prompt = replay.prompts[-1]
    assert "cc_entrypoint=sdk-cli;\nYou are a Claude agent" in prompt  # not glued together
    reminder = rec["body"]["messages"][1]
    assert reminder["role"] == "system"
    turn = f"system\n{reminder['content'][:40]}"  # (the decoded prompt has no special tokens)
    assert turn in prompt and prompt.index(turn) > prompt.index("Run echo hi")  # a system turn where it was sent
    assert "DeferredToolPlaceholder" not in prompt  # defer_loading: not in the prompt until a search loads it
    assert '"name": "Bash"' in prompt
    [e] = await replay.stack.recorded()
    no_effect = e.context["request"]["no_effect"]
    assert set(no_effect) >= {"thinking", "output_config.effort", "context_management", "metadata", "anthropic-beta"}


async def test_codex_namespaces_flatten_and_hosted_tools_are_refused(replay: Replay) -> None:
    rec = _load(FIXTURES / "codex" / "preset-001.json")
    r = await replay.send(rec, "ex-codex")
    assert r.status_code == 200, r.text
    prompt = replay.prompts[-1]
    assert '"name": "spawn_agent"' in prompt  # multi_agent_v1's functions, under their own names
    [e] = await replay.stack.recorded()
    assert set(e.context["request"]["no_effect"]) >= {"reasoning", "include.reasoning.encrypted_content", "store"}
    # web_search runs on the vendor's side: refused, saying how Codex is told not to send it.
    rec2 = _load(FIXTURES / "codex" / "known-model-001.json")
    rec2["body"]["tools"] = [t for t in rec2["body"]["tools"] if t["type"] != "tool_search"]
    r2 = await replay.send(rec2, "ex-codex-2")
    assert r2.status_code == 400
    assert 'web_search = \\"disabled\\"' in r2.text or 'web_search = "disabled"' in r2.json()["error"]["message"]
    rec2["body"]["tools"] = [t for t in rec2["body"]["tools"] if t["type"] != "web_search"]
    r3 = await replay.send(rec2, "ex-codex-3")
    assert r3.status_code == 200, r3.text  # the freeform apply_patch is offered as a one-string function
    assert '"name": "apply_patch"' in replay.prompts[-1] and "*** Begin Patch" in replay.prompts[-1]


@pytest.mark.parametrize(
    ("engine_context", "setting"),
    [
        (4096, None),
        (ENGINE_CONTEXT, 4096),
    ],  # the engine's own context; a setting below it (OPENGYRE_PROXY_CONTEXT_LENGTH)
)
async def test_a_prompt_past_the_served_context_gets_the_vendors_error(
    event_log: EventLog, caplog: pytest.LogCaptureFixture, engine_context: int, setting: int | None
) -> None:
    app, _ = scripted_sglang(lambda _p: "fine", context_length=engine_context)
    engine = HttpServer(app)
    await engine.start()
    st = await make_stack(event_log, {}, models=MODELS, context_length=setting)
    try:
        await st.gateway.pool.add("small", engine.url)
        rec = _load(FIXTURES / "claude-code" / "shell-001.json")
        r = await Replay(st, []).send(rec, "ex-long")
        assert r.status_code == 400
        err = r.json()
        assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
        assert err["error"]["message"].startswith("prompt is too long: ")
        assert err["error"]["message"].endswith(" tokens > 4095 maximum")
        assert st.gateway.stats.rejected == {"400": 1}  # counted, and logged with its reason:
        # ...and said by `opengyre status` (the proxy's notes): the context served, where it comes from, the refusal.
        served = st.gateway.served_context()
        assert served.tokens == 4096
        assert served.source.startswith(
            "the context_length setting (OPENGYRE_PROXY_CONTEXT_LENGTH); the engines report 262144"
            if setting
            else "engine small's own (its /model_info context_length; the least of 1 active)"
        ), served
        assert st.gateway.stats.over_context == 1
        assert st.gateway.stats.last_over_context == f"anthropic: {err['error']['message']}"
        [refusal] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("refused a ")]
        assert refusal.startswith("refused a anthropic call: 400 invalid_request: prompt is too long: ")
        assert await st.recorded() == []
    finally:
        await st.gateway.stop()
        await engine.stop()


async def test_opencodes_title_call_does_not_make_the_agent_a_sub_agent(replay: Replay) -> None:
    for p in _fixtures("opencode"):
        r = await replay.send(_load(p), "ex-oc")
        assert r.status_code == 200, r.text
    roles = [e.role for e in await replay.stack.recorded()]
    assert roles == ["sub-agent", "main", "main"]  # the title generator, then the agent's two calls


async def test_claude_codes_sub_agent_is_a_sub_agent(replay: Replay) -> None:
    files = [p for p in _fixtures("claude-code") if p.name.startswith("subagent-")]
    for p in files:
        r = await replay.send(_load(p), "ex-cc-sub")
        assert r.status_code == 200, r.text
    events = await replay.stack.recorded()
    systems = [_load(p)["body"]["system"][2]["text"][:60] for p in files]
    main_system = systems[0]
    for e, s in zip(events, systems, strict=True):
        assert e.role == ("main" if s == main_system else "sub-agent"), (e.role, s)
    assert {e.role for e in events} == {"main", "sub-agent"}


@pytest.mark.parametrize("harness", ["claude-code", "codex"])
async def test_a_harness_compaction_is_the_main_agents_summary(replay: Replay, harness: str) -> None:
    # Captured with `--usage 195000`: the agent's call, its compaction request (Claude Code: a continuation;
    # Codex: the conversation again without tools), the conversation continued from the summary.
    for p in [p for p in _fixtures(harness) if p.name.startswith("compact-")]:
        r = await replay.send(_load(p), f"ex-{harness}-compact")
        assert r.status_code == 200, r.text
    assert [e.role for e in await replay.stack.recorded()] == ["main", "main-summary", "main"]


async def test_a_sub_agents_compaction_is_the_sub_agents_summary(replay: Replay) -> None:
    # Claude Code's compaction turn (captured) as the next turn of its sub-agent's last request (captured).
    files = [p for p in _fixtures("claude-code") if p.name.startswith("subagent-")]
    recs = [_load(p) for p in files]
    main_system = recs[0]["body"]["system"][2]["text"]
    sub = next(i for i, rec in reversed(list(enumerate(recs))) if rec["body"]["system"][2]["text"] != main_system)
    for rec in recs[: sub + 1]:
        r = await replay.send(rec, "ex-cc-sub-compact")
        assert r.status_code == 200, r.text
    compaction = _load(FIXTURES / "claude-code" / "compact-002.json")["body"]["messages"][-1]["content"][-1]
    summary = json.loads(json.dumps(recs[sub]))
    summary["body"]["messages"].append({"role": "user", "content": [compaction]})
    r = await replay.send(summary, "ex-cc-sub-compact")
    assert r.status_code == 200, r.text
    roles = [e.role for e in await replay.stack.recorded()]
    assert roles[sub] == "sub-agent" and roles[-1] == "sub-agent-summary", (sub, roles)


@pytest.mark.parametrize(
    ("harness", "episode"),
    [("claude-code", "subagent"), ("claude-code", "compact"), ("codex", "compact"), ("opencode", "shell")],
)
async def test_a_real_harness_tree_exports_as_atif_that_harbors_models_accept(
    replay: Replay, harness: str, episode: str
) -> None:
    eid = f"ex-atif-{harness}-{episode}"
    for p in [p for p in _fixtures(harness) if p.name.startswith(f"{episode}-")]:
        r = await replay.send(_load(p), eid)
        assert r.status_code == 200, r.text
    events = await replay.stack.recorded()
    tree = TrajectoryTree(eid, events)
    doc = json.loads(json.dumps(export_execution(tree, [StoredCall(i, e) for i, e in enumerate(events, 1)])))
    _check_atif(doc)  # Harbor's own models, and the format's rules
    assert len(doc.get("subagent_trajectories", [])) == len(tree.leaves()) - 1  # every other path embedded
    assert sum(len(t["steps"]) for t in [doc, *doc.get("subagent_trajectories", [])]) >= len(events)


def _tool(name: str, **kw: Any) -> dict[str, Any]:
    return {"name": name, "description": f"the {name} tool", "input_schema": {"type": "object"}, **kw}


async def test_anthropic_defer_loading_tools_join_once_a_tool_search_loads_them(replay: Replay) -> None:
    tools = [_tool("ToolSearch"), _tool("Hidden", defer_loading=True)]
    first = {"model": "qwen3-8b", "max_tokens": 8, "tools": tools, "messages": [{"role": "user", "content": "hi"}]}
    assert (await replay.post("/messages", first, anthropic_api=True)).status_code == 200
    assert '"name": "Hidden"' not in replay.prompts[-1]
    loaded = {
        **first,
        "messages": [
            {"role": "user", "content": "hi"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_1", "name": "ToolSearch", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_1",
                        "content": [{"type": "tool_reference", "tool_name": "Hidden"}],
                    }
                ],
            },
        ],
    }
    assert (await replay.post("/messages", loaded, anthropic_api=True)).status_code == 200
    assert '"name": "Hidden"' in replay.prompts[-1]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "a tool the vendor runs or defines"),
        ({"mcp_servers": [{"type": "url", "url": "http://127.0.0.1:1", "name": "m"}]}, "mcp_servers: not supported"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2048}}, "does not support extended thinking"),
        ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}]}}, "is not supported"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort: must be one of"),
        ({"frobnicate": 1}, "frobnicate: Extra inputs are not permitted"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
                        ],
                    }
                ]
            },
            "the served model reads text only",
        ),
    ],
)
async def test_anthropic_refuses_what_it_cannot_do_in_its_error_shape(
    replay: Replay, extra: dict[str, Any], message: str
) -> None:
    body = {"model": "qwen3-8b", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}], **extra}
    r = await replay.post("/messages", body, anthropic_api=True)
    assert r.status_code == 400
    err = r.json()
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert message in err["error"]["message"]
    assert await replay.stack.recorded() == []


async def test_anthropic_count_tokens_takes_what_messages_takes(replay: Replay) -> None:
    rec = _load(FIXTURES / "claude-code" / "shell-002.json")["body"]
    body = {k: rec[k] for k in ("model", "messages", "system", "tools", "thinking", "output_config")}
    r = await replay.post("/messages/count_tokens", body, anthropic_api=True)
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 10_000
    assert await replay.stack.recorded() == []  # counting is not a call


@pytest.mark.parametrize("stream", [False, True])
async def test_responses_calls_name_their_namespace_and_freeform_tools_answer_as_custom_calls(
    replay: Replay, stream: bool
) -> None:
    tools = [
        {"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents", "tools": [
            {"type": "function", "name": "spawn_agent", "description": "start one", "parameters": {"type": "object"}}
        ]},
        {"type": "custom", "name": "apply_patch", "description": "edit files", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
    ]  # fmt: skip
    patch = "*** Begin Patch\n*** End Patch\n"
    replay.reply = (
        '<tool_call>{"name": "spawn_agent", "arguments": {"task": "x"}}</tool_call>'
        + '<tool_call>{"name": "apply_patch", "arguments": '
        + json.dumps({"input": patch})
        + "}</tool_call>"
    )
    body = {"model": "qwen3-8b", "input": "go", "tools": tools, "stream": stream, "store": False,
            "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "medium", "summary": "auto"}}  # fmt: skip
    r = await replay.post("/responses", body, anthropic_api=False)
    assert r.status_code == 200, r.text
    resp = _sse(r.text)[-1][1]["response"] if stream else r.json()
    parsed = openai.types.responses.Response.model_validate(resp)
    fc, ctc = parsed.output
    assert fc.type == "function_call" and fc.name == "spawn_agent" and fc.namespace == "multi_agent_v1"
    assert ctc.type == "custom_tool_call" and ctc.name == "apply_patch" and ctc.input == patch
    assert parsed.store is False and parsed.reasoning is not None and parsed.reasoning.effort == "medium"
    if stream:
        kinds = [d["type"] for _, d in _sse(r.text)]
        assert "response.custom_tool_call_input.done" in kinds and "response.function_call_arguments.done" in kinds
    # Sent back as Codex sends them, the calls render as the model wrote them: the conversation extends.
    follow = {
        **body,
        "stream": False,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "go"}]},
            {"type": "function_call", "name": "spawn_agent", "namespace": "multi_agent_v1", "call_id": fc.call_id, "arguments": fc.arguments},
            {"type": "custom_tool_call", "name": "apply_patch", "call_id": ctc.call_id, "input": ctc.input},
            {"type": "function_call_output", "call_id": fc.call_id, "output": "started"},
            {"type": "custom_tool_call_output", "call_id": ctc.call_id, "output": "patched"},
        ],
    }  # fmt: skip
    replay.reply = "fine"
    r2 = await replay.post("/responses", follow, anthropic_api=False)
    assert r2.status_code == 200, r2.text
    first, second = await replay.stack.recorded()
    assert second.parent_call_id == first.call_id


async def test_chat_reasoning_effort_is_accepted_with_no_effect_and_recorded(replay: Replay) -> None:
    body = {"model": "qwen3-8b", "messages": [{"role": "user", "content": "hi"}], "reasoning_effort": "high"}
    r = await replay.post("/chat/completions", body, anthropic_api=False)
    assert r.status_code == 200, r.text
    [e] = await replay.stack.recorded()
    assert e.context["request"]["no_effect"] == {"reasoning_effort": "the served model has no reasoning"}
    for extra in ({"reasoning_effort": "maximal"}, {"functions": [{"name": "f"}]}, {"modalities": ["text", "audio"]}):
        bad = await replay.post("/chat/completions", {**body, **extra}, anthropic_api=False)
        assert bad.status_code == 400, extra
        assert bad.json()["error"]["param"] == next(iter(extra))
