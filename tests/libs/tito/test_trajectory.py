"""TITO prompt building: token-level extension, drift detection, retries as siblings, rewrites as branches."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer
from opengyre.tito import ExecutionTrajectory
from opengyre.trajectory import Node, TrajectoryTree


@pytest.fixture(scope="module")
def codec() -> ChatCodec:
    return ChatCodec(load_tokenizer())


def _turn(codec: ChatCodec, text: str, *, eos: bool = True) -> list[int]:
    return codec.encode(text) + ([codec.eos_id] if eos else [])


def _commit(
    t: ExecutionTrajectory,
    msgs: list[dict[str, Any]],
    cid: str,
    output: list[int],
    reply: dict[str, Any],
    tools: list[dict[str, Any]] | None = None,
) -> Any:
    plan = t.plan(msgs, tools)
    t.commit(plan, cid, output, reply, "main")
    return plan


def test_a_faithful_next_turn_extends_the_previous_tokens_without_drift(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"}]
    p1 = _commit(t, m1, "c1", _turn(codec, "hello!"), {"role": "assistant", "content": "hello!"})
    assert p1.branch == "root" and p1.parent_call_id is None and p1.prompt_ids == codec.render_ids(m1)
    m2 = [*m1, {"role": "assistant", "content": "hello!"}, {"role": "user", "content": "more"}]
    p2 = t.plan(m2, None)
    assert p2.branch == "extension" and p2.parent_call_id == "c1" and p2.drift is None
    assert p2.prompt_ids == p1.prompt_ids + _turn(codec, "hello!") + p2.delta_ids
    assert p2.prompt_ids == codec.render_ids(m2)
    assert p2.prefix_len == len(p1.prompt_ids) + len(_turn(codec, "hello!"))
    assert p2.context == {"base": 3, "messages": [{"role": "user", "content": "more"}]}


def test_reformatted_history_keeps_the_policys_tokens_and_records_drift(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "user", "content": "go"}]
    emitted = '<tool_call>{"name": "bash", "arguments": {"cmd":  "ls"}}</tool_call>'  # two spaces, as sampled
    out = _turn(codec, emitted)
    call = {"id": "k1", "type": "function", "function": {"name": "bash", "arguments": '{"cmd":  "ls"}'}}
    _commit(t, m1, "c1", out, {"role": "assistant", "content": "", "tool_calls": [call]})
    # The harness sends the call back re-serialised (one space): same JSON value, different bytes.
    back = {**call, "function": {"name": "bash", "arguments": '{"cmd": "ls"}'}}
    m2 = [
        *m1,
        {"role": "assistant", "content": "", "tool_calls": [back]},
        {"role": "tool", "tool_call_id": "k1", "content": "a.py"},
    ]
    p2 = t.plan(m2, None)
    assert p2.branch == "extension" and p2.parent_call_id == "c1"
    assert p2.prompt_ids[: len(t.nodes["c1"].prompt) + len(out)] == list(t.nodes["c1"].prompt) + out
    fresh = codec.render_ids(m2)
    assert p2.prompt_ids != fresh
    assert p2.drift is not None and p2.drift.kind == "retokenization"
    at = p2.drift.position
    assert p2.prompt_ids[:at] == fresh[:at] and p2.prompt_ids[at] != fresh[at]
    t.commit(p2, "c2", _turn(codec, "ok"), {"role": "assistant", "content": "ok"}, "main")
    assert t.drift_count == 1


def test_a_turn_cut_by_length_is_closed_with_eos(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "user", "content": "go"}]
    _commit(t, m1, "c1", _turn(codec, "abc", eos=False), {"role": "assistant", "content": "abc"})
    m2 = [*m1, {"role": "assistant", "content": "abc"}, {"role": "user", "content": "next"}]
    p2 = t.plan(m2, None)
    assert p2.branch == "extension" and p2.delta_ids[0] == codec.eos_id
    assert p2.prompt_ids == codec.render_ids(m2) and p2.drift is None


def test_a_repeated_request_is_a_retry_sibling_with_identical_tokens(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "user", "content": "go"}]
    _commit(t, m1, "c1", _turn(codec, "a"), {"role": "assistant", "content": "a"})
    m2 = [*m1, {"role": "assistant", "content": "a"}, {"role": "user", "content": "again"}]
    p2 = _commit(t, m2, "c2", _turn(codec, "b"), {"role": "assistant", "content": "b"})
    p3 = t.plan(m2, None)
    assert p3.branch == "retry" and p3.parent_call_id == "c1"
    assert (p3.prefix_len, p3.delta_ids, p3.prompt_ids) == (p2.prefix_len, p2.delta_ids, p2.prompt_ids)
    t.commit(p3, "c3", _turn(codec, "c"), {"role": "assistant", "content": "c"}, "main")
    tree = TrajectoryTree("x")
    for cid in ("c1", "c2", "c3"):
        n = t.nodes[cid]
        tree.add(
            Node(
                cid,
                n.parent,
                n.prefix_len,
                n.prompt[n.prefix_len :] if n.parent else n.prompt,
                n.output,
                [0.0] * len(n.output),
            )
        )
    assert sorted(tree.leaves()) == ["c2", "c3"]  # both attempts stay trajectories of their own


def test_rewritten_history_branches_where_it_forks(codec: ChatCodec) -> None:
    t = ExecutionTrajectory("x", codec)
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "task"}]
    call = {"id": "k", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    _commit(
        t,
        m1,
        "c1",
        _turn(codec, '<tool_call>{"name": "f", "arguments": {}}</tool_call>'),
        {"role": "assistant", "content": "", "tool_calls": [call]},
    )
    m2 = [
        *m1,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "k", "content": "long output " * 5},
    ]
    _commit(t, m2, "c2", _turn(codec, "x  "), {"role": "assistant", "content": "x  "})
    # The harness edits the tool output: the conversation still extends c1's, so it forks there (c2's sibling).
    m3 = [*m2[:-1], {"role": "tool", "tool_call_id": "k", "content": "[truncated]"}]
    p3 = t.plan(m3, None)
    assert (p3.branch, p3.parent_call_id, p3.prefix_len) == ("extension", "c1", t.nodes["c1"].n_tokens)
    # The harness strips c2's answer: c2's request is still there, its reply is not. c2's prompt tokens are
    # reused and the edited reply becomes context: a sibling of c2.
    m4 = [*m2, {"role": "assistant", "content": "x"}, {"role": "user", "content": "next"}]
    p4 = t.plan(m4, None)
    c2 = t.nodes["c2"]
    assert (p4.branch, p4.parent_call_id, p4.prefix_len) == ("rewrite", "c1", c2.prefix_len)
    assert p4.prompt_ids[: len(c2.prompt)] == list(c2.prompt)
    assert p4.prompt_ids == codec.render_ids(m4) and p4.drift is None
    # A compaction replaces the history after the system prompt: a new root.
    m5 = [{"role": "system", "content": "S"}, {"role": "user", "content": "Summary: did the task."}]
    p5 = t.plan(m5, None)
    assert p5.branch == "root" and p5.parent_call_id is None and p5.prefix_len == 0


def test_token_prompts_attach_where_a_brute_force_search_would(codec: ChatCodec) -> None:
    """Random forks of random earlier calls: the delta-only scan finds the longest shared prefix, and nodes
    rebuild exactly the tokens they were committed with."""
    import random

    rng = random.Random(7)
    t = ExecutionTrajectory("x", codec)
    full: dict[str, list[int]] = {}
    for i in range(60):
        if full and rng.random() < 0.8:
            src = full[rng.choice(list(full))]
            prompt = src[: rng.randint(0, len(src))] + [rng.randrange(5) for _ in range(rng.randint(1, 6))]
        else:
            prompt = [rng.randrange(5) for _ in range(rng.randint(1, 8))]
        plan = t.plan_tokens(prompt)
        best = max((sum(1 for _ in _common(toks, prompt)) for toks in full.values()), default=0)
        shared = plan.prefix_len
        assert plan.prompt_ids == prompt and plan.delta_ids == prompt[shared:]
        if plan.parent_call_id is not None:
            parent_tokens = full[plan.parent_call_id]
            assert parent_tokens[:shared] == prompt[:shared] and shared <= best
            # never inside the parent's prompt when the grandparent could hold the fork
            assert shared > t.nodes[plan.parent_call_id].prompt_len
        output = [rng.randrange(5) for _ in range(rng.randint(0, 4))]
        t.commit(plan, f"c{i}", output, None, "main")
        full[f"c{i}"] = prompt + output
    for cid, toks in full.items():
        assert t.nodes[cid].token_array().tolist() == toks
    stored = sum(len(n.delta) + len(n.out) for n in t.nodes.values())
    assert stored < sum(len(v) for v in full.values())


def _common(a: list[int], b: list[int]) -> Any:
    for x, y in zip(a, b, strict=False):
        if x != y:
            return
        yield x


def test_the_hashes_a_commit_extends_from_its_plan_are_those_of_hashing_the_conversation_again(
    codec: ChatCodec,
) -> None:
    # commit extends the planned request's hash by the reply; a plan without one (as a restore makes) is hashed
    # whole: both must index the same requests and conversations, or a restored execution would not extend.
    tools = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
    live, again = ExecutionTrajectory("x", codec), ExecutionTrajectory("x", codec)
    m1 = [{"role": "system", "content": "S"}, {"role": "user", "content": "go"}]
    calls = [(m1, "a")]
    m2 = [*m1, {"role": "assistant", "content": "a"}, {"role": "user", "content": "more"}]  # an extension
    calls += [(m2, "b"), (m2, "c")]  # and its retry
    calls += [([*m1, {"role": "assistant", "content": "edited"}, {"role": "user", "content": "more"}], "d")]  # rewrite
    branches = []
    for i, (msgs, text) in enumerate(calls):
        plan = live.plan(msgs, tools)
        assert plan.request_hash is not None
        branches.append(plan.branch)
        reply = {"role": "assistant", "content": text}
        live.commit(plan, f"c{i}", _turn(codec, text), reply, "main")
        again.commit(replace(plan, request_hash=None), f"c{i}", _turn(codec, text), reply, "main")
    assert branches == ["root", "extension", "retry", "rewrite"]
    assert live._by_req == again._by_req and live._by_conv == again._by_conv
    assert len(live._by_conv) == 4 and len(live._by_req) == 3  # the retry repeats a request
    m3 = [*m2, {"role": "assistant", "content": "c"}, {"role": "user", "content": "on"}]
    assert live.plan(m3, tools).parent_call_id == again.plan(m3, tools).parent_call_id == "c2"
