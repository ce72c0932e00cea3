"""Tool and think time between turns: fitted from a trace's timestamps (ATIF steps have them), carried by a
profile, waited by the load generator with the slot held, and what it does to C* against a real HTTP server of
known capacity."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opengyre.bench import (
    DelayDist,
    LengthDist,
    LoadConfig,
    Profile,
    ProfileError,
    SessionPlan,
    TimedServer,
    TokenFill,
    TurnPlan,
    fit_profile,
    read_trace,
    run_load,
    synthesise_sessions,
    timed_server_thread,
)
from opengyre.models import load_tokenizer

from .test_cli import og


def _atif(sid: str, stamps: list[str | None]) -> dict[str, object]:
    steps: list[dict[str, object]] = [{"source": "user", "message": "fix the bug"}]
    for k, ts in enumerate(stamps):
        step: dict[str, object] = {
            "source": "agent",
            "message": f"step {k}",
            "observation": {"results": [{"content": f"output of tool {k}"}]},
        }
        if ts is not None:
            step["timestamp"] = ts
        steps.append(step)
    return {"schema_version": "ATIF-v1.4", "session_id": sid, "steps": steps}


def test_atif_timestamps_give_the_gaps_between_turns_and_a_fitted_tool_latency(tmp_path: Path) -> None:
    tok = load_tokenizer()
    trace = [
        _atif("a", ["2026-01-01T00:00:00Z", "2026-01-01T00:00:01.5Z", "2026-01-01T00:00:04.5Z"]),
        _atif("b", ["2026-01-01T00:00:00+00:00", "2026-01-01T00:00:02+00:00"]),
    ]
    sessions = read_trace(trace, "atif", tok)
    assert [t.delay_s for t in sessions[0].turns] == [None, 1.5, 3.0]
    assert [t.delay_s for t in sessions[1].turns] == [None, 2.0]
    prof = fit_profile("agent", sessions, "test")
    assert prof.tool_latency is not None and prof.tool_latency.kind == "lognormal"
    assert prof.tool_latency.mean == pytest.approx((1.5 + 3.0 + 2.0) / 3)
    assert Profile.from_dict(prof.to_dict()) == prof  # it travels in the profile document

    # the CLI writes it into the fitted profile; a trace without timestamps has none (no invented value)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(trace))
    code, out = og("bench", "fit", str(path), "--format", "atif", "--out", str(tmp_path / "p.json"))
    assert code == 0, out
    assert json.loads((tmp_path / "p.json").read_text())["tool_latency"]["mean"] == pytest.approx(6.5 / 3)
    assert fit_profile("x", read_trace([_atif("c", [None, None])], "atif", tok), "t").tool_latency is None

    for stamps, words in (
        (["2026-01-01T00:00:05Z", "2026-01-01T00:00:01Z"], "step 3: its timestamp is before the previous agent step's"),
        (["yesterday"], "step 2: timestamp 'yesterday' is not ISO 8601"),
        ([17], "step 2: timestamp must be an ISO 8601 string, got 17"),
    ):
        path.write_text(json.dumps([_atif("d", stamps)]))  # type: ignore[arg-type]
        code, out = og("bench", "fit", str(path), "--format", "atif")
        assert code == 2 and words in out and len(out.strip().splitlines()) == 1, out


def test_tool_latency_documents_are_validated() -> None:
    assert DelayDist.fit([0.0, 1.0, 2.0]).kind == "empirical"  # a zero gap: no lognormal has one
    assert DelayDist.fit([0.5, 0.5]) == DelayDist("constant", 0.5)
    base = {
        "name": "p",
        "first_prompt": {"kind": "constant", "mean": 4},
        "observation": {"kind": "constant", "mean": 4},
        "output": {"kind": "constant", "mean": 4},
        "turns": {"kind": "constant", "mean": 2},
    }
    for bad, words in (
        ({"kind": "constant", "mean": -1}, "tool_latency mean must be >= 0 seconds"),
        ({"kind": "lognormal", "mean": "slow"}, "mean must be a number of seconds, got 'slow'"),
        ({"kind": "gamma", "mean": 1}, "tool_latency kind must be one of"),
        ({"kind": "empirical", "values": [1, -2]}, "needs values >= 0"),
        ("1s", "expected an object with kind and mean"),
    ):
        with pytest.raises(ProfileError, match=words):
            Profile.from_dict({**base, "tool_latency": bad})
    assert Profile.from_dict({**base, "tool_latency": None}).tool_latency is None


def test_synthesised_sessions_wait_the_profiles_tool_latency_and_keep_their_lengths() -> None:
    fill = TokenFill.for_tokenizer(load_tokenizer())
    d = LengthDist("lognormal", 6, 0.5)
    prof = Profile("p", d, d, d, LengthDist("constant", 5))
    with_tools = Profile(**{**prof.__dict__, "tool_latency": DelayDist("lognormal", 0.25, 0.8)})
    plain, tooled = synthesise_sessions(prof, 400, fill, seed=3), synthesise_sessions(with_tools, 400, fill, seed=3)
    assert [[(t.messages, t.max_tokens) for t in s.turns] for s in plain] == [
        [(t.messages, t.max_tokens) for t in s.turns] for s in tooled
    ]  # the same sessions: only the waits differ
    assert all(t.delay_s == 0 for s in plain for t in s.turns)
    waits = [t.delay_s for s in tooled for t in s.turns[1:]]
    assert all(s.turns[0].delay_s == 0 for s in tooled)
    assert abs(sum(waits) / len(waits) / 0.25 - 1) < 0.05  # 1,600 draws of a lognormal of mean 0.25 s


async def test_the_load_generator_waits_the_tool_latency_holding_its_slot() -> None:
    srv = await TimedServer(0.02, 0.005).start()
    plan = SessionPlan(
        "s",
        (
            TurnPlan(({"role": "user", "content": "q1"},), 3),
            TurnPlan(({"role": "user", "content": "q2"},), 3, delay_s=0.3),
        ),
    )
    other = SessionPlan("o", (TurnPlan(({"role": "user", "content": "o1"},), 3),))
    try:
        run = await run_load(LoadConfig(srv.url, "timed", concurrency=1), [plan, other])
    finally:
        await srv.stop()
    assert not run.partial, run.errors
    first, second, third = run.requests
    assert (first.session, second.session, third.session) == ("s", "s", "o")  # the slot was held meanwhile
    assert second.sent - (first.sent + (first.e2el or 0)) >= 0.3
    assert second.queue_s < 0.3  # waiting for tools is not queueing
    by = {r.prompt: r for r in srv.records}
    assert by["q2"].received - by["q1"].finished >= 0.3  # the server saw nothing from the session meanwhile


def test_tool_latency_moves_c_star_against_a_server_of_known_capacity(tmp_path: Path) -> None:
    """Two requests served at a time, 100 ms each. Without tool time a session keeps the server busy all the
    time, so C* = 2; with 100 ms of tool time after each reply it keeps it busy half the time: C* = 4. (Timings
    long enough that a loaded machine's late wake-ups stay small beside them; the step tests' verdicts are
    reported, but only the point estimates are asserted, since a loaded machine can leave a step undecided.)"""
    base = {
        "name": "agent",
        "first_prompt": {"kind": "constant", "mean": 4},
        "observation": {"kind": "constant", "mean": 2},
        "output": {"kind": "constant", "mean": 3},
        "turns": {"kind": "constant", "mean": 3},
    }
    prof = tmp_path / "agent.json"
    prof.write_text(json.dumps({**base, "tool_latency": {"kind": "constant", "mean": 0.1}}))
    c_star = {}
    # the profile's own tool latency, and the same profile with it taken away on the command line
    for name, extra in (("profile's 100ms", ()), ("none", ("--tool-latency", "0"))):
        with timed_server_thread(0.06, 0.02, slots=2) as srv:
            code, out = og(
                "bench", "sweep", "--url", srv.url, "--model", "timed", "--profile", str(prof),
                "--concurrency", "1,2,4,8", "--sessions-per-slot", "2", "--repeats", "3", "--max-repeats", "6",
                "--tolerance", "0.25", "--beyond", "1", "--out", str(tmp_path / name), *extra,
            )  # fmt: skip
        assert code == 0, out
        doc = json.loads((tmp_path / name / "sweep.json").read_text())
        assert doc["c_star"] in doc["c_star_compatible"], doc["steps"]
        c_star[name] = doc["c_star"]
        assert (doc["profile"]["tool_latency"] is None) == (name == "none")
    assert c_star == {"none": 2, "profile's 100ms": 4}


def test_tool_latency_on_the_command_line_is_recorded_and_checked(tmp_path: Path) -> None:
    with timed_server_thread(0.01, 0.005) as srv:
        code, out = og(
            "bench", "run", "--url", srv.url, "--model", "timed", "--profile", "chatbot", "--length-scale", "0.01",
            "--turn-scale", "0.2", "--sessions", "2", "-c", "2", "--tool-latency", "0.05", "--out", str(tmp_path),
        )  # fmt: skip
    assert code == 0, out
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["profile"]["tool_latency"] == {"kind": "constant", "mean": 0.05}
    code, out = og("bench", "run", "--url", srv.url, "--model", "m", "--tool-latency", "-1")
    assert code == 2 and "--tool-latency" in out and "-1.0 is not a number of seconds >= 0" in out, out
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps([{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}]))
    code, out = og("bench", "run", "--url", srv.url, "--model", "m", "--trace", str(trace), "--tool-latency", "1")
    assert code == 2 and "--tool-latency change a profile; a trace is sent as recorded" in out, out
