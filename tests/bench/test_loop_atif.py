"""The committed ATIF fixture from our own loop (svc-bench/bench/loop_atif.py) reads as the bench's trace."""

from __future__ import annotations

import json
from pathlib import Path

from opengyre.bench import fit_profile, read_trace
from opengyre.models import load_tokenizer

FIXTURE = Path(__file__).resolve().parents[2] / "svc-bench" / "bench" / "data" / "loop-atif.json"


def test_loop_rollouts_are_sessions_with_turns_and_gaps() -> None:
    doc = json.loads(FIXTURE.read_text())
    sessions = read_trace(doc, "atif", load_tokenizer())
    # 3 tasks x groups of 4, the harness's 4 turns each (the tiny model never submits)
    assert len(sessions) == 12 and all(len(s.turns) == 4 for s in sessions)
    assert {s.session_id for s in sessions} == {f"atif-s1-g{g}-m{m}" for g in range(3) for m in range(4)}
    for s in sessions:
        first, *rest = s.turns
        assert [m["role"] for m in first.messages] == ["system", "user"]
        assert all(t.delay_s is not None and t.delay_s > 0 for t in rest)  # timestamps from the proxy's records
    profile = fit_profile("loop", sessions, "atif")
    assert profile.tool_latency is not None  # fitted from those gaps
    steps = [st for t in doc for st in t["steps"] if st["source"] == "agent"]
    assert all("prompt_token_ids" not in st["metrics"] for st in steps)  # stripped: the file stays small


def test_the_loops_replies_capped_at_48_tokens_fit_as_recorded() -> None:
    # the harness ran at --max-tokens 48: 9 of 12 first replies and 10 of 12 second ones stop at it
    profile = fit_profile("loop", read_trace(json.loads(FIXTURE.read_text()), "atif", load_tokenizer()), "atif")
    first, second = profile.output_by_turn[:2]
    assert first.kind == "empirical" and sorted(first.values) == [1, 5, 18] + [48] * 9
    assert second.kind == "empirical" and max(second.values) == 48 and second.mean == 42.5
    assert [d.to_dict() for d in profile.output_by_turn[2:]] == [{"kind": "constant", "mean": 48.0}] * 2
    assert profile.group_size == 4  # groups of 4 rollouts of each task start with the same request
