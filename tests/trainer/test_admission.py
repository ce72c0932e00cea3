"""Admission: evaluator and infrastructure failures never reach the loss; timeouts keep their real score;
the circuit breaker; group statistics over survivors only."""

from __future__ import annotations

import statistics

import pytest

from opengyre.trainer import AdmissionPolicy, ExecutionOutcome, GroupInput, classify_failure, classify_outcome


def o(i: int, status: str = "completed", score: float | None = 1.0, fc: str | None = None) -> ExecutionOutcome:
    return ExecutionOutcome(f"e{i:02d}", "g", status, score, fc)  # type: ignore[arg-type]


def test_failure_classes_from_exit_status_only() -> None:
    assert classify_failure(137) == "oom"  # SIGKILLed from outside
    assert classify_failure(124) is None  # the execution's own time limit: graded as timed out
    assert classify_failure(1) is None and classify_failure(0) is None and classify_failure(None) is None


def test_outcome_verdicts() -> None:
    assert classify_outcome(o(0, "timed-out", 0.4)) == ("ok", "timed-out")
    assert classify_outcome(o(0, "completed", 0.0)) == ("ok", "completed")  # a valid zero is trained
    assert classify_outcome(o(0, "evaluator-failed", None, "evaluator"))[0] == "excluded"
    assert classify_outcome(o(0, "completed", None))[0] == "excluded"
    assert classify_outcome(o(0, "infra-failed", None, "oom")) == ("masked", "infra:oom")
    assert classify_outcome(o(0, "completed", 0.0, "sandbox"))[0] == "masked"  # never a negative
    assert classify_outcome(o(0, "completed", 0.2, "network")) == ("transient", "transient:network")
    assert classify_outcome(o(0, "completed", float("nan")))[0] == "excluded"
    # the agent's own code hung or ran out of memory while graded: a trained zero, not infrastructure
    assert classify_outcome(o(0, "completed", 0.0, "agent-timeout")) == ("ok", "completed:agent-timeout")
    assert classify_outcome(o(0, "timed-out", 0.0, "agent-oom")) == ("ok", "timed-out:agent-oom")


def test_timed_out_members_get_their_score_and_failures_get_nothing() -> None:
    outs = [
        o(0, "completed", 1.0),
        o(1, "timed-out", 0.5),
        o(2, "completed", 0.0),
        o(3, "evaluator-failed", None, "evaluator"),
        o(4, "infra-failed", None, "oom"),
        o(5, "infra-failed", None, "sandbox"),
    ]
    g = AdmissionPolicy(group_size=6).admit("g", outs)
    d = g.by_id()
    assert [d[f"e{i:02d}"].decision for i in range(6)] == ["train", "train", "train", "excluded", "masked", "masked"]
    mean, std = statistics.mean([1.0, 0.5, 0.0]), statistics.stdev([1.0, 0.5, 0.0])
    assert g.mean == pytest.approx(mean) and g.std == pytest.approx(std) and g.survivors == 3
    assert d["e01"].advantage == pytest.approx((0.5 - mean) / (std + 1e-6))
    assert d["e00"].advantage == pytest.approx((1.0 - mean) / (std + 1e-6))
    assert all(d[f"e{i:02d}"].advantage == 0.0 for i in (3, 4, 5))


def test_lone_survivor_gets_no_advantage() -> None:
    outs = [o(0, "completed", 1.0), o(1, "evaluator-failed", None), o(2, "infra-failed", None, "oom")]
    g = AdmissionPolicy(group_size=3).admit("g", outs)
    assert g.by_id()["e00"].decision == "no-signal" and g.by_id()["e00"].advantage == 0.0
    assert g.trained() == []


def test_no_reward_spread_gives_no_signal() -> None:
    g = AdmissionPolicy(group_size=3).admit("g", [o(i, score=0.5) for i in range(3)])
    assert {a.decision for a in g.admissions} == {"no-signal"}


def test_transient_failures_are_filtered_until_the_breaker_trips() -> None:
    # group of 8: half is 4. Two infra failures already dropped; transient members filtered while
    # dropped + 1 < 4, so exactly one more is filtered and the rest are kept with their real score.
    outs = [
        o(0, "infra-failed", None, "oom"),
        o(1, "infra-failed", None, "sandbox"),
        o(2, "completed", 0.1, "network"),
        o(3, "completed", 0.2, "timeout"),
        o(4, "completed", 0.3, "network"),
        o(5, "completed", 1.0),
        o(6, "completed", 0.0),
        o(7, "timed-out", 0.7),
    ]
    g = AdmissionPolicy(group_size=8).admit("g", outs)
    d = g.by_id()
    assert d["e02"].decision == "filtered"
    assert d["e03"].decision == "train" and "breaker-kept" in d["e03"].reason
    assert d["e04"].decision == "train"
    assert g.breaker_tripped
    survivors = [0.2, 0.3, 1.0, 0.0, 0.7]
    assert g.survivors == 5 and g.mean == pytest.approx(statistics.mean(survivors))


def test_no_breaker_when_few_transients() -> None:
    outs = [o(0, "completed", 0.1, "network"), *[o(i, score=float(i % 2)) for i in range(1, 8)]]
    g = AdmissionPolicy(group_size=8).admit("g", outs)
    assert g.by_id()["e00"].decision == "filtered" and not g.breaker_tripped


def test_dr_grpo_does_not_divide_by_std() -> None:
    g = AdmissionPolicy(group_size=2, normalize_std=False).admit("g", [o(0, score=1.0), o(1, score=0.0)])
    assert [a.advantage for a in g.admissions] == [pytest.approx(0.5), pytest.approx(-0.5)]


def test_positive_only_curriculum_keeps_only_positive_advantages() -> None:
    g = AdmissionPolicy(group_size=3, positive_only=True).admit(
        "g", [o(0, score=1.0), o(1, score=0.0), o(2, score=0.5)]
    )
    d = g.by_id()
    assert d["e00"].decision == "train" and d["e00"].advantage > 0
    assert (d["e01"].decision, d["e01"].reason) == ("filtered", "positive-only")
    assert (d["e02"].decision, d["e02"].reason) == ("filtered", "positive-only")  # the mean: advantage 0
    assert g.mean == pytest.approx(0.5)  # statistics still use every survivor


def test_the_breaker_counts_half_of_the_real_group_not_the_default_size() -> None:
    # A group of 4 under a policy whose default is 16: half of the group is 2, so after one transient member is
    # filtered the next one is kept (with the default size it would have been filtered too).
    outs = [o(0, score=0.1, fc="network"), o(1, score=0.2, fc="network"), o(2, score=1.0), o(3, score=0.0)]
    d = AdmissionPolicy(group_size=16).admit("g", outs).by_id()
    assert d["e00"].decision == "filtered" and d["e01"].decision == "train" and "breaker-kept" in d["e01"].reason
    assert AdmissionPolicy(group_size=16).admit("g", outs, size=16).by_id()["e01"].decision == "filtered"


def test_the_breaker_is_global_over_the_steps_samples() -> None:
    # Two groups of 4: 8 samples, the breaker trips once a 4th would be dropped. g1 already lost two members to
    # infrastructure; its transient member is the 3rd drop (filtered), g2's would be the 4th (kept). A breaker per
    # group would do the opposite: keep g1's (half of g1 gone) and filter g2's (none of g2 gone).
    g1 = [
        ExecutionOutcome("g1-e0", "g1", "infra-failed", None, "oom"),
        ExecutionOutcome("g1-e1", "g1", "infra-failed", None, "sandbox"),
        ExecutionOutcome("g1-e2", "g1", "completed", 0.2, "network"),
        ExecutionOutcome("g1-e3", "g1", "completed", 1.0),
    ]
    g2 = [
        ExecutionOutcome("g2-e0", "g2", "completed", 1.0),
        ExecutionOutcome("g2-e1", "g2", "completed", 0.0),
        ExecutionOutcome("g2-e2", "g2", "completed", 0.5, "timeout"),
        ExecutionOutcome("g2-e3", "g2", "completed", 0.3),
    ]
    step = AdmissionPolicy(breaker_ratio=0.5).admit_step([GroupInput("g1", g1, 4), GroupInput("g2", g2, 4)])
    d = {a.execution_id: a for g in step.groups for a in g.admissions}
    assert d["g1-e2"].decision == "filtered"
    assert d["g2-e2"].decision == "train" and d["g2-e2"].reason.endswith("breaker-kept")
    assert (step.breaker_tripped, step.breaker_kept, step.samples, step.dropped) == (True, 1, 8, 3)
    assert d["g1-e3"].decision == "no-signal"  # the lone survivor of g1
    # Drops found after the verdicts (a corrupt trajectory) count against the breaker too.
    later = AdmissionPolicy().admit_step(
        [GroupInput("g1", g1, 4), GroupInput("g2", g2, 4)], dropped={"g2-e3": ("excluded", "rejected:x")}
    )
    dl = {a.execution_id: a for g in later.groups for a in g.admissions}
    assert dl["g1-e2"].decision == "train" and later.dropped == 3  # 2 infra + the corrupt one: the 4th is kept
