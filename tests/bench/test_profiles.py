"""Profiles: the paper's means hold, fitting recovers a distribution, traces and profiles are validated."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from opengyre.bench import (
    PAPER_PROFILES,
    DelayDist,
    LengthDist,
    Profile,
    ProfileError,
    TokenFill,
    TraceSession,
    TraceTurn,
    fit_profile,
    paper_profile,
    profile_from,
    read_trace,
    replay_sessions,
    shadow_sessions,
    synthesise_sessions,
)
from opengyre.models import load_tokenizer

PAPER = {
    "chat": (187, 299, 1),
    "chatbot": (1291, 169, 10),
    "coding": (9995, 32, 85),
    "terminal": (7811, 31, 61),
    "computer-use": (1399, 85, 8),
}


@pytest.mark.parametrize("name", sorted(PAPER))
def test_paper_profiles_reproduce_the_published_means(name: str) -> None:
    isl, osl, turns = PAPER[name]
    p = paper_profile(name)
    assert p.expected_isl() == pytest.approx(isl, rel=1e-9)
    assert p.output.mean == osl and p.turns.mean == turns
    # and by sampling: the request-weighted mean of the snowballing input
    rng = random.Random(1)
    isls: list[int] = []
    outs: list[int] = []
    for _ in range(4000 if turns < 20 else 600):
        ctx = p.first_prompt.sample(rng)
        for k in range(p.turns.sample(rng)):
            if k:
                ctx += p.observation.sample(rng)
            isls.append(ctx)
            o = p.output.sample(rng)
            outs.append(o)
            ctx += o
    assert sum(isls) / len(isls) == pytest.approx(isl, rel=0.08)
    assert sum(outs) / len(outs) == pytest.approx(osl, rel=0.08)


def test_unknown_profile_and_malformed_profile_documents() -> None:
    with pytest.raises(ProfileError, match="built in: chat"):
        paper_profile("nope")
    good = PAPER_PROFILES["chatbot"].to_dict()
    assert Profile.from_dict(good) == PAPER_PROFILES["chatbot"]
    with pytest.raises(ProfileError, match="missing output"):
        Profile.from_dict({k: v for k, v in good.items() if k != "output"})
    with pytest.raises(ProfileError, match="unknown keys"):
        Profile.from_dict({**good, "isl": 3})
    with pytest.raises(ProfileError, match="mean must be positive"):
        Profile.from_dict({**good, "output": {"kind": "lognormal", "mean": -1}})
    with pytest.raises(ProfileError, match="kind must be"):
        Profile.from_dict({**good, "turns": {"kind": "zipf", "mean": 3}})
    # a value of the wrong type is refused, not converted (a string mean, a fractional recorded length)
    with pytest.raises(ProfileError, match=r"output\.mean must be a number, got '12'"):
        Profile.from_dict({**good, "output": {"kind": "lognormal", "mean": "12"}})
    with pytest.raises(ProfileError, match=r"turns\.values\[1\] must be a whole number, got 2\.5"):
        Profile.from_dict({**good, "turns": {"kind": "empirical", "values": [1, 2.5]}})
    with pytest.raises(ProfileError, match="length_scale must be a number, got 'big'"):
        Profile.from_dict({**good, "length_scale": "big"})
    with pytest.raises(ProfileError, match="shared_prefix must be a non-negative whole number of tokens, got -50"):
        Profile.from_dict({**good, "shared_prefix": -50})


def test_scaling_is_explicit_and_reported() -> None:
    p = paper_profile("coding").scaled(length=0.05, turns=0.1)
    assert p.length_scale == 0.05 and p.turn_scale == 0.1
    assert p.expected_isl() < 9995 * 0.05
    assert p.to_dict()["length_scale"] == 0.05


def test_a_stated_tool_latency_replaces_the_profiles_and_bad_ones_are_refused() -> None:
    own = replace(PAPER_PROFILES["chatbot"], tool_latency=DelayDist("lognormal", 2.0, 0.5))
    assert own.with_tool_latency(None) == own  # unset: the profile's own
    assert own.with_tool_latency(0.25).tool_latency == DelayDist("constant", 0.25)
    assert own.with_tool_latency(0).tool_latency is None  # 0: none
    assert profile_from("chatbot", 0.5, 1.0, 1.5).tool_latency == DelayDist("constant", 1.5)
    for bad in (-0.1, math.nan, math.inf, True):
        with pytest.raises(ProfileError, match="tool_latency must be a number of seconds >= 0"):
            own.with_tool_latency(bad)


def test_fit_recovers_a_lognormal() -> None:
    rng = random.Random(3)
    true = LengthDist("lognormal", 200.0, 0.6)
    sessions = [
        TraceSession(str(i), tuple(TraceTurn(true.sample(rng), true.sample(rng)) for _ in range(5))) for i in range(400)
    ]
    p = fit_profile("fitted", sessions, "test")
    assert p.output.mean == pytest.approx(200, rel=0.1)
    assert p.output.sigma == pytest.approx(0.6, rel=0.1)
    assert p.turns.kind == "constant" and p.turns.mean == 5


def test_fit_keeps_the_mean_of_lengths_that_are_not_lognormal() -> None:
    # replies cut at a limit, as recorded traces often are: most at the cap, a few short ones
    outs = [300] * 30 + [40, 60, 80, 120, 200] * 2
    sessions = [TraceSession(str(i), (TraceTurn(10, o),)) for i, o in enumerate(outs)]
    p = fit_profile("capped", sessions, "test")
    mean = sum(outs) / len(outs)
    assert p.output.mean == pytest.approx(mean)  # a likelihood fit on the logs says 264 (+5.6 %)
    rng = random.Random(0)
    assert sum(p.output.sample(rng) for _ in range(20000)) / 20000 == pytest.approx(mean, rel=0.02)


def test_fill_has_exact_token_counts_and_unique_session_prefixes() -> None:
    tok = load_tokenizer()
    fill = TokenFill.for_tokenizer(tok)
    rng = random.Random(0)
    for n in (1, 7, 300):
        assert len(tok.encode(fill.text(n, rng), add_special_tokens=False)) == n
    plans = synthesise_sessions(paper_profile("chatbot").scaled(0.05), 20, fill, seed=1)
    firsts = [p.turns[0].messages[-1]["content"] for p in plans]
    # no two sessions share even a short prefix: nothing warms another's prefix cache
    assert len({f[:4] for f in firsts}) == len(firsts)


def test_sharegpt_and_atif_traces_and_their_errors() -> None:
    tok = load_tokenizer()
    share = [
        {
            "id": "a",
            "conversations": [
                {"from": "human", "value": "hello"},
                {"from": "gpt", "value": "hi there"},
                {"from": "human", "value": "more"},
                {"from": "gpt", "value": "ok"},
            ],
        }
    ]
    s = read_trace(share, "sharegpt", tok)
    assert [(t.new_tokens, t.output_tokens) for t in s[0].turns] == [(5, 8), (4, 2)]  # byte-level: one per byte
    assert replay_sessions(s)[0].turns[1].messages == ({"role": "user", "content": "more"},)
    atif = {
        "schema_version": "ATIF-v1.6",
        "session_id": "x",
        "agent": {"name": "a", "version": "1"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "fix it"},
            {
                "step_id": 2,
                "source": "agent",
                "message": "run",
                "metrics": {"completion_tokens": 12},
                "tool_calls": [{"tool_call_id": "c", "function_name": "bash", "arguments": {}}],
                "observation": {"results": [{"source_call_id": "c", "content": "1 failed"}]},
            },
            {"step_id": 3, "source": "agent", "message": "done"},
        ],
    }
    a = read_trace(atif, "atif", tok)
    assert [(t.new_tokens, t.output_tokens) for t in a[0].turns] == [(6, 12), (8, 4)]
    with pytest.raises(ProfileError, match="conversation 0: no 'conversations'"):
        read_trace([{"x": 1}], "sharegpt", tok)
    with pytest.raises(ProfileError, match="schema_version"):
        read_trace({"steps": []}, "atif", tok)
    with pytest.raises(ProfileError, match="unknown trace format"):
        read_trace([], "csv", tok)
    with pytest.raises(ProfileError, match="no request with a reply"):
        read_trace([{"conversations": [{"from": "human", "value": "x"}]}], "sharegpt", tok)


def test_fit_from_our_own_recorded_calls() -> None:
    from opengyre.bench import calls_sessions
    from opengyre.events import ModelCallRecorded

    def call(
        ex: str, cid: str, parent: str | None, prefix: int, delta: int, out: int, role: str = "main"
    ) -> ModelCallRecorded:
        return ModelCallRecorded(
            execution_id=ex,
            call_id=cid,
            parent_call_id=parent,
            prefix_len=prefix,
            prompt_delta_ids=[1] * delta,
            output_ids=[2] * out,
            role=role,
        )  # type: ignore[arg-type]

    calls = [
        call("e1", "a", None, 0, 100, 10),
        call("e1", "b", "a", 110, 30, 5),  # extends a's prompt + output by a 30-token observation
        call("e1", "c", "b", 145, 20, 7),
        call("e1", "sub", None, 0, 50, 3, role="sub-agent"),  # not the main trajectory: not a turn
        call("e2", "x", None, 0, 80, 4),
    ]
    sessions = {s.session_id: s for s in calls_sessions(calls)}
    assert [(t.new_tokens, t.output_tokens) for t in sessions["e1"].turns] == [(100, 10), (30, 5), (20, 7)]
    assert [(t.new_tokens, t.output_tokens) for t in sessions["e2"].turns] == [(80, 4)]
    prof = fit_profile("ours", list(sessions.values()), "recorded calls")
    assert prof.observation.kind == "lognormal" and prof.turns.kind == "lognormal"
    with pytest.raises(ProfileError, match="replayed exactly"):
        replay_sessions(list(sessions.values()))


def test_a_system_prompt_every_session_shares_is_the_traces_shared_prefix() -> None:
    tok = load_tokenizer()
    system = "You are a coding agent. Tools: bash, edit, view. " * 3
    doc = [
        {
            "id": str(i),
            "conversations": [
                {"from": "system", "value": system},
                {"from": "human", "value": f"fix bug {i} " * (3 + i)},
                {"from": "gpt", "value": "done" * (1 + i)},
            ],
        }
        for i in range(4)
    ]
    sessions = read_trace(doc, "sharegpt", tok)
    n_sys = len(tok.encode(system, add_special_tokens=False))
    assert all(s.shared_prefix == n_sys for s in sessions)
    for i, s in enumerate(sessions):  # the first turn's own tokens: the user message alone
        assert s.turns[0].new_tokens == len(tok.encode(f"fix bug {i} " * (3 + i), add_special_tokens=False))
        assert s.turns[0].messages[0]["content"] == system  # the replay still sends it
    prof = fit_profile("agent", sessions, "test")
    assert prof.shared_prefix == n_sys
    fill = TokenFill.for_tokenizer(tok)
    for plans in (synthesise_sessions(prof, 3, fill), shadow_sessions(sessions, fill)):
        heads = [p.turns[0].messages[0] for p in plans]
        assert all(h == heads[0] and h["role"] == "system" for h in heads)  # one prefix, common to all
        assert len(tok.encode(heads[0]["content"], add_special_tokens=False)) == n_sys
        assert len({p.turns[0].messages[1]["content"][:4] for p in plans}) == len(plans)  # the rest is unique
    # sessions that share nothing, or whose first request is only the shared message, keep no prefix
    alone = [{**c, "conversations": c["conversations"][1:]} for c in doc]
    assert all(s.shared_prefix == 0 for s in read_trace(alone, "sharegpt", tok))
    same = [
        {
            "id": str(i),
            "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "x" * (i + 1)}],
        }
        for i in range(3)
    ]
    assert all(s.shared_prefix == 0 and s.turns[0].new_tokens == 11 for s in read_trace(same, "sharegpt", tok))


def test_fit_keeps_lengths_per_turn_index_where_the_trace_has_enough_of_them() -> None:
    # observations grow turn by turn (an agent reading bigger files); 10 sessions reach turn 3, 3 reach turn 4
    def session(i: int) -> TraceSession:
        turns = [TraceTurn(50, 5), TraceTurn(100 + i, 10), TraceTurn(300 + i, 20)]
        if i < 3:
            turns.append(TraceTurn(900, 40))
        return TraceSession(str(i), tuple(turns))

    sessions = [session(i) for i in range(10)]
    p = fit_profile("growing", sessions, "test")
    assert [d.mean for d in p.observation_by_turn] == [pytest.approx(104.5), pytest.approx(304.5)]
    assert [d.mean for d in p.output_by_turn] == [5, 10, 20]  # turn 4: 3 requests, under MIN_PER_TURN_FIT
    assert p.observation_at(4) == p.observation and p.output_at(4) == p.output  # pooled beyond
    assert Profile.from_dict(p.to_dict()) == p
    assert p.scaled(0.5).observation_at(3).mean == pytest.approx(152.25)
    tok = load_tokenizer()
    plans = synthesise_sessions(p, 40, TokenFill.for_tokenizer(tok), seed=2)
    for k, want in ((1, 104.5), (2, 304.5)):  # turn 2 and 3: the turn's own lengths, not the pooled ~250
        reached = [pl for pl in plans if len(pl.turns) > k]
        got = [len(tok.encode(pl.turns[k].messages[-1]["content"], add_special_tokens=False)) for pl in reached]
        assert len(got) >= 20 and sum(got) / len(got) == pytest.approx(want, rel=0.1)
        assert {pl.turns[k].max_tokens for pl in reached} == {10 * k}
    with pytest.raises(ProfileError, match=r"observation_by_turn\[0\]"):
        Profile.from_dict({**p.to_dict(), "observation_by_turn": [{"kind": "lognormal"}]})


def test_replies_cut_at_the_recorders_max_tokens_are_never_drawn_beyond_it() -> None:
    # a harness capping every call at 48 tokens: most replies stop at the cap, a few end early
    rng = random.Random(5)
    replies = [[48 if rng.random() < 0.75 else rng.randint(1, 47) for _ in range(3)] for _ in range(30)]
    sessions = [TraceSession(str(i), tuple(TraceTurn(100, r) for r in rs)) for i, rs in enumerate(replies)]
    p = fit_profile("capped", sessions, "test")
    first = [rs[0] for rs in replies]
    for dist, recorded in ((p.output_at(1), first), (p.output, [r for rs in replies for r in rs])):
        assert dist.kind == "empirical" and dist.mean == pytest.approx(sum(recorded) / len(recorded))
        draws = [dist.sample(rng) for _ in range(4000)]
        assert max(draws) == 48  # a lognormal with this mean and spread draws ~20 % of them above the cap
        at_cap = sum(d == 48 for d in draws) / len(draws)
        assert at_cap == pytest.approx(recorded.count(48) / len(recorded), abs=0.03)
    assert Profile.from_dict(p.to_dict()) == p
    # lengths whose largest value does not recur are not taken for capped: lognormal by moments as before
    free = [TraceSession(str(i), (TraceTurn(100, 10 + 3 * i),)) for i in range(12)]
    assert fit_profile("free", free, "test").output.kind == "lognormal"


def test_sessions_that_start_alike_are_fitted_and_sent_as_groups() -> None:
    # an RL loop's trace: 3 tasks, each sampled by a group of 4 rollouts (the same first request), replies differ
    tok = load_tokenizer()
    doc = [
        {
            "id": f"{g}-{m}",
            "conversations": [
                {"from": "human", "value": f"task {g}: " + "do this " * (10 + 5 * g)},
                {"from": "gpt", "value": "x" * (3 + m)},
                {"from": "human", "value": f"tool said {m} " * 4},
                {"from": "gpt", "value": "y" * 4},
            ],
        }
        for g in range(3)
        for m in range(4)
    ]
    sessions = read_trace(doc, "sharegpt", tok)
    prof = fit_profile("groups", sessions, "test")
    assert prof.group_size == 4 and Profile.from_dict(prof.to_dict()) == prof
    assert fit_profile("alone", sessions[::4], "test").group_size == 1  # one session per task
    fill = TokenFill.for_tokenizer(tok)
    for plans in (synthesise_sessions(prof, 12, fill, seed=1), shadow_sessions(sessions, fill, seed=1)):
        firsts = [p.turns[0].messages for p in plans]
        assert [len({repr(f) for f in firsts[g * 4 : g * 4 + 4]}) for g in range(3)] == [1, 1, 1]  # shared in a group
        assert len({repr(f) for f in firsts}) == 3  # and only there
        assert len({p.turns[1].messages[-1]["content"] for p in plans}) == 12  # the rest is each session's own
    with pytest.raises(ProfileError, match="group_size must be a whole number of sessions >= 1, got 0"):
        Profile.from_dict({**prof.to_dict(), "group_size": 0})
