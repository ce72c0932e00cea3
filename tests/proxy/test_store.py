"""The trajectory store: rebuilt from the log it equals the live projection, its trees equal the events' trees,
it refuses calls that do not fit, and it exports ATIF."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from harbor.models.trajectories import Trajectory
from sqlalchemy import Engine, select

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded
from opengyre.projection import ProjectionRunner, dump_rows, rebuild
from opengyre.proxy import (
    TrajectoryProjection,
    export_execution,
    list_executions,
    load_calls,
    load_execution,
    load_tree,
    path_mask,
)
from opengyre.proxy._grpc import resolve_contexts
from opengyre.proxy.recording._restore import restore_trajectory
from opengyre.proxy.recording._store import CALLS
from opengyre.store import DeadLetter
from opengyre.trajectory import TrajectoryTree

from .conftest import Stack, make_stack

M = "opengyre-tiny"


async def _caught_up(projection: TrajectoryProjection, log: EventLog, db: Engine) -> None:
    stop = asyncio.Event()
    runner = ProjectionRunner(projection, log, db)
    await runner.ensure_consumer()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def _branchy_execution(st: Stack, eid: str) -> None:
    client = st.openai(eid)
    m1: list[Any] = [{"role": "system", "content": "agent"}, {"role": "user", "content": "do it"}]
    r1 = await client.chat.completions.create(model=M, messages=m1, max_tokens=5)
    m2 = [
        *m1,
        {"role": "assistant", "content": r1.choices[0].message.content or ""},
        {"role": "user", "content": "and then"},
    ]
    await client.chat.completions.create(model=M, messages=m2, max_tokens=5, stream=True)
    await client.chat.completions.create(model=M, messages=m2, max_tokens=5)
    await st.openai(eid, "sub-agent").chat.completions.create(
        model=M, messages=[{"role": "user", "content": "help"}], max_tokens=5
    )


async def test_rebuilding_the_store_gives_the_live_rows_and_the_events_trees(
    event_log: EventLog, engine: Engine, engine_a: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a})
    try:
        for eid in ("ex-1", "ex-2"):
            await _branchy_execution(st, eid)
        events = await st.recorded()
        as_stored = await st.recorded_as_stored()
        live_tito = {t.execution_id: t for t in st.gateway.executions()}
    finally:
        await st.gateway.stop()
    projection = TrajectoryProjection()
    await _caught_up(projection, event_log, engine)
    live = dump_rows(engine, projection.tables)
    assert len(live["proxy_calls"]) == len(events) == 8
    await rebuild(projection, event_log, engine)
    assert dump_rows(engine, projection.tables) == live
    # The log and the store hold references; the tokens and context are stored once, in the payload store.
    assert all(e.payload is not None and not e.output_ids and e.context is None for e in as_stored)
    with engine.connect() as conn:
        blobs = conn.execute(select(CALLS.c.prompt_delta, CALLS.c.output_logprobs, CALLS.c.context)).all()
    assert blobs and all(r == (b"", b"", None) for r in blobs)
    for eid in ("ex-1", "ex-2"):
        stored = await load_tree(engine, event_log, eid)
        live_tree = TrajectoryTree(eid, [e for e in events if e.execution_id == eid])
        assert sorted(stored.leaves()) == sorted(live_tree.leaves()) and len(stored.leaves()) == 3
        for leaf in live_tree.leaves():
            assert path_mask(stored, leaf) == live_tree.path_sequence(leaf)
        with engine.connect() as conn:
            rows = load_calls(conn, eid)  # as recorded: the tokens by reference
        assert [c.event for c in rows] == [e for e in as_stored if e.execution_id == eid]
        calls = await load_execution(engine, event_log, eid)  # the tokens joined back in
        assert [c.event for c in calls] == [e for e in events if e.execution_id == eid]
        # After a restart the gateway's TITO state comes back from these rows: it plans as the live one did.
        restored, kept = restore_trajectory(eid, st.gateway.codec, calls), live_tito[eid]
        assert list(restored.nodes) == list(kept.nodes)
        for cid, node in kept.nodes.items():
            assert restored.nodes[cid].token_array().tolist() == node.token_array().tolist()
            convs = [node.conv_after, node.conv_after[:-1], [*node.conv_after, {"role": "user", "content": "on"}]]
            for msgs in convs:
                if msgs:
                    assert restored.plan(msgs, None) == kept.plan(msgs, None)
    with engine.connect() as conn:
        summaries = {s.execution_id: s for s in list_executions(conn)}
    s1 = summaries["ex-1"]
    assert (s1.calls, s1.roots) == (4, 2) and 0 < s1.stored_tokens < s1.flat_tokens


async def test_calls_that_do_not_fit_the_tree_are_dead_lettered(event_log: EventLog, engine: Engine) -> None:
    ok = ModelCallRecorded(
        execution_id="x", call_id="a", prompt_delta_ids=[1, 2, 3], output_ids=[4], output_logprobs=[-0.5]
    )
    bad = [
        ModelCallRecorded(
            execution_id="x",
            call_id="b",
            parent_call_id="nope",
            prefix_len=1,
            prompt_delta_ids=[5],
            output_ids=[6],
            output_logprobs=[-0.1],
        ),
        ModelCallRecorded(
            execution_id="x",
            call_id="c",
            parent_call_id="a",
            prefix_len=9,
            prompt_delta_ids=[5],
            output_ids=[6],
            output_logprobs=[-0.1],
        ),
        ModelCallRecorded(execution_id="x", call_id="a", prompt_delta_ids=[1], output_ids=[2], output_logprobs=[0.0]),
        ModelCallRecorded(
            execution_id="x", call_id="d", prompt_delta_ids=[1], output_ids=[2, 3], output_logprobs=[0.0]
        ),
    ]
    good = ModelCallRecorded(
        execution_id="x",
        call_id="e",
        parent_call_id="a",
        prefix_len=4,
        prompt_delta_ids=[7],
        output_ids=[8],
        output_logprobs=[-0.2],
    )
    await event_log.append_many([ok, *bad, good])
    await _caught_up(TrajectoryProjection(), event_log, engine)
    with engine.connect() as conn:
        dead = conn.execute(select(DeadLetter.stream_seq, DeadLetter.detail).order_by(DeadLetter.stream_seq)).all()
    tree = await load_tree(engine, event_log, "x")
    assert [r[0] for r in dead] == [2, 3, 4, 5]
    assert "unknown parent" in dead[0][1] and "prefix_len" in dead[1][1] and "already" in dead[2][1]
    assert sorted(tree.nodes) == ["a", "e"] and tree.tokens("e") == (1, 2, 3, 4, 7, 8)


def _check_atif(doc: dict[str, Any]) -> None:
    """Harbor's own ATIF models accept our export, and the ATIF-v1.7 rules Harbor's validator applies (PROTOCOLS
    §5) hold on it, nested trajectories included."""
    Trajectory.model_validate(doc)
    _check_atif_rules(doc)


def _check_atif_rules(doc: dict[str, Any]) -> None:
    allowed_top = {
        "schema_version",
        "session_id",
        "trajectory_id",
        "agent",
        "steps",
        "notes",
        "final_metrics",
        "continued_trajectory_ref",
        "subagent_trajectories",
        "extra",
    }
    assert set(doc) <= allowed_top and doc["schema_version"] == "ATIF-v1.7"
    assert {"name", "version"} <= set(doc["agent"])
    assert doc["steps"], "an ATIF trajectory needs at least one step"
    agent_only = {"model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics"}
    step_keys = {
        "step_id",
        "timestamp",
        "source",
        "model_name",
        "reasoning_effort",
        "message",
        "reasoning_content",
        "tool_calls",
        "observation",
        "metrics",
        "is_copied_context",
        "llm_call_count",
        "extra",
    }
    for i, step in enumerate(doc["steps"]):
        assert set(step) <= step_keys and step["step_id"] == i + 1
        assert step["source"] in ("system", "user", "agent") and isinstance(step["message"], str)
        if step["source"] != "agent":
            assert not agent_only & set(step)
        if step.get("llm_call_count") == 0:
            assert "metrics" not in step and "reasoning_content" not in step
        ids = {t["tool_call_id"] for t in step.get("tool_calls", [])}
        for t in step.get("tool_calls", []):
            assert set(t) <= {"tool_call_id", "function_name", "arguments", "extra"} and isinstance(
                t["arguments"], dict
            )
        for r in step.get("observation", {}).get("results", []):
            assert "source_call_id" not in r or r["source_call_id"] in ids
    tids = [t.get("trajectory_id") for t in doc.get("subagent_trajectories", [])]
    assert len(tids) == len(set(tids)) and None not in tids
    for sub in doc.get("subagent_trajectories", []):
        _check_atif_rules(sub)


async def test_atif_export_follows_the_format_and_carries_exact_tokens(
    event_log: EventLog, engine: Engine, tool_stack: Stack
) -> None:
    from ._policy import TOOL_OUTPUT, TOOLS, conversation

    st = tool_stack
    client = st.openai("ex-atif")
    msgs: list[Any] = conversation(0)
    r1 = await client.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
    tc = r1.choices[0].message.tool_calls[0]  # type: ignore[index]
    msgs += [
        r1.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": tc.id, "content": TOOL_OUTPUT},
    ]
    await client.chat.completions.create(model=M, messages=msgs, tools=TOOLS, max_tokens=80, temperature=0)  # type: ignore[arg-type]
    await client.chat.completions.create(model=M, messages=[{"role": "user", "content": "side"}], max_tokens=3)
    events = await st.recorded()
    assert all(e.context is None and e.payload for e in await st.recorded_as_stored())  # out of band
    await _caught_up(TrajectoryProjection(), event_log, engine)
    calls = await load_execution(engine, event_log, "ex-atif")
    tree = TrajectoryTree("ex-atif", [c.event for c in calls])
    contexts = await resolve_contexts(event_log, calls)
    doc = json.loads(json.dumps(export_execution(tree, calls, contexts=contexts)))
    _check_atif(doc)
    steps = doc["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    first = steps[2]
    assert first["tool_calls"] == [{"tool_call_id": tc.id, "function_name": "bash", "arguments": {"cmd": "ls"}}]
    assert first["observation"]["results"] == [{"content": TOOL_OUTPUT, "source_call_id": tc.id}]
    assert first["metrics"]["prompt_token_ids"] == list(tree.prompt(events[0].call_id))
    assert first["metrics"]["completion_token_ids"] == list(events[0].output_ids)
    assert steps[3]["metrics"]["logprobs"] == list(events[1].output_logprobs)
    assert doc["final_metrics"]["total_completion_tokens"] == len(events[0].output_ids) + len(events[1].output_ids)
    assert [s["extra"]["leaf_call_id"] for s in doc["subagent_trajectories"]] == [events[2].call_id]
