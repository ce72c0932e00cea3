"""The summary of a run read back from a real nats-server, checked figure by figure against the events appended
(recomputed here the plain way), and against the scheduler's own fold for the watermark and the cells' roles."""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import replace

import pytest

from opengyre.eventlog import MemoryEventLog
from opengyre.events import (
    CellRegistered,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    PatternUse,
    SkillIngested,
    TaskHardened,
    TaskSynthesized,
    TaskValidated,
    TrainingStepCompleted,
)
from opengyre.report import RunFold, fold_events, summarize
from opengyre.scheduler import SchedulerState
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import Simulator

from ...scheduler._small import small_config
from ._run import covered, of, scored_by, scores, scripted_run, secs, status_counts, watermark_walk


@pytest.mark.parametrize("seed", [0, 1])
async def test_the_summary_of_a_logged_run_matches_its_events(memory_log: MemoryEventLog, seed: int) -> None:
    events = scripted_run(seed)
    await memory_log.append_many(events)
    s = await summarize(memory_log)

    assert (s.events, s.first_seq, s.last_seq) == (len(events), 1, len(events))
    assert s.by_type == dict(Counter(e.type_name() for e in events))
    skills = of(events, SkillIngested)
    assert (s.skills_accepted, s.skills_rejected) == (
        sum(e.accepted for e in skills),
        sum(not e.accepted for e in skills),
    )
    assert s.tasks == len(of(events, TaskSynthesized))
    first_verdicts = [e for e in of(events, TaskValidated) if e.task_version == 1]
    assert s.tasks_validated == sum(e.ok for e in first_verdicts)
    assert s.tasks_rejected == sum(not e.ok for e in first_verdicts)

    # Executions: statuses and failure classes of the dispatched ones; the ghost is an anomaly, not a finish.
    score = scores(events)
    dispatched = of(events, ExecutionDispatched)
    assert s.executions.dispatched == len(dispatched)
    assert s.executions.finished == len(score)
    assert s.executions.running == len(dispatched) - len(score)
    assert s.executions.by_status == dict(status_counts(events))
    fcs = Counter(e.failure_class for e in of(events, ExecutionFinished) if e.execution_id in score and e.failure_class)
    assert s.executions.by_failure_class == dict(fcs)
    valid = [v for v in score.values() if v is not None]
    assert s.executions.scored == len(valid)
    assert s.executions.reward_mean == pytest.approx(sum(valid) / len(valid))
    assert s.anomalies == {"execution finished but never dispatched": 1}

    # Reward per training step: the scores of what each step consumed (trained and dropped).
    steps = of(events, TrainingStepCompleted)
    assert [r.step for r in s.steps] == [e.step for e in steps]
    for r, e in zip(s.steps, steps, strict=True):
        consumed = [*e.execution_ids, *e.dropped]
        got = [score[x] for x in consumed if score.get(x) is not None]
        assert r.count == len(got) and r.trained == len(e.execution_ids) and r.dropped == len(e.dropped)
        assert r.unscored == sum(1 for x in consumed if x in score and score[x] is None)
        assert (r.mean, r.min, r.max) == (pytest.approx(sum(got) / len(got)), min(got), max(got))
        assert r.weight_version == e.weight_version and r.at_s == pytest.approx(secs(e) - secs(events[0]))
    batches = scored_by(events, lambda d: d.step)
    assert {k: (n, pytest.approx(m)) for k, (n, m) in s.rewards_by_batch.items()} == batches

    # The watermark after every event that moves it, and its end.
    assert [(p.watermark, p.rollout_capacity) for p in s.watermark] == watermark_walk(events)
    assert s.watermark[-1].watermark == len(dispatched) - len(score)

    # Cells: the role each holds now and every span, back to back from registration.
    roles = {e.cell_id: e.role for e in of(events, CellRegistered)}
    for e in of(events, CellRoleChanged):
        roles[e.cell_id] = e.to_role
    assert {c.cell_id: c.role for c in s.cells} == roles
    changes = of(events, CellRoleChanged)
    assert len(s.cell_spans) == len(of(events, CellRegistered)) + len(changes)
    c0 = [sp for sp in s.cell_spans if sp.cell_id == "c0"]
    assert [sp.role for sp in c0] == ["rollout"] + [e.to_role for e in changes if e.cell_id == "c0"]
    assert all(a.end_s == b.start_s for a, b in itertools.pairwise(c0)) and c0[-1].end_s is None

    # Difficulty per round: knob means over the task versions at that version.
    versions: dict[tuple[str, int], list[PatternUse]] = {}
    for e in events:
        if isinstance(e, TaskSynthesized):
            versions[(e.task_id, e.task_version)] = e.patterns
        elif isinstance(e, TaskHardened):
            versions[(e.task_id, e.to_version)] = e.patterns
    rounds = sorted({v for _, v in versions})
    assert [d.round for d in s.difficulty] == rounds
    for d in s.difficulty:
        at = [p for (_, v), ps in versions.items() if v == d.round for p in ps]
        assert d.tasks == sum(1 for _, v in versions if v == d.round)
        depth = [p.knobs["depth"] for p in at if p.pattern_id == "long-chain"]
        assert d.knobs["long-chain.depth"] == pytest.approx(sum(depth) / len(depth))
    by_version = scored_by(events, lambda x: x.task_version)
    assert {d.round: (d.executions, d.reward_mean) for d in s.difficulty if d.executions} == {
        k: (n, pytest.approx(m)) for k, (n, m) in by_version.items()
    }
    assert [(h.task_id, h.from_version, h.to_version) for h in s.hardenings] == [
        (e.task_id, e.from_version, e.to_version) for e in of(events, TaskHardened)
    ]

    # Where time went: rollout is the time some execution ran; training the time c0 trained.
    t0 = secs(events[0])
    finish = {e.execution_id: secs(e) - t0 for e in of(events, ExecutionFinished)}
    rollout = [(secs(e) - t0, finish[e.execution_id]) for e in dispatched]
    assert s.time.rollout_s == pytest.approx(covered(rollout))
    into = [secs(e) - t0 for e in changes if e.to_role == "training-core"]
    out = [secs(e) - t0 for e in changes if e.from_role == "training-core"]
    assert s.time.training_s == pytest.approx(sum(b - a for a, b in zip(into, out, strict=True)))
    assert s.time.span_s == pytest.approx(secs(events[-1]) - t0)
    assert sum(s.time.cell_seconds.values()) == pytest.approx(
        sum(s.time.span_s - (secs(e) - t0) for e in of(events, CellRegistered))
    )

    # Model calls by weight version, output tokens split by the spans of the calls whose weights changed.
    calls = of(events, ModelCallRecorded)
    want_calls = Counter(e.weight_version for e in calls)
    want_out: Counter[str] = Counter()
    for e in calls:
        if e.weight_versions:
            for sp in e.weight_versions:
                want_out[sp.version] += sp.end - sp.start
        else:
            want_out[e.weight_version] += len(e.output_ids)
    got = {v.weight_version: v for v in s.weight_versions}
    assert {k: v.calls for k, v in got.items() if v.calls} == dict(want_calls)
    assert {k: v.output_tokens for k, v in got.items()} == dict(want_out)
    assert sum(v.prompt_tokens for v in got.values()) == sum(len(e.prompt_delta_ids) for e in calls)
    assert not [n for n in s.notes if "no " in n[:3]]  # the whole story is in the log: nothing reported missing


async def test_a_range_of_the_log_is_the_fold_of_that_range(memory_log: MemoryEventLog) -> None:
    events = scripted_run(2)
    await memory_log.append_many(events)
    cut = len(events) // 2
    part = await summarize(memory_log, start_seq=cut + 1)
    assert part == fold_events((i + 1, e) for i, e in enumerate(events) if i >= cut)
    assert part.first_seq == cut + 1 and part.events == len(events) - cut


def test_the_watermark_and_the_roles_are_the_schedulers_own_along_a_simulated_run() -> None:
    """The simulator's events through the report's fold and through the scheduler's state fold, event by event."""
    sim = Simulator(replace(small_config(steps=4), record_events=True), make_policy("elastic"))
    sim.run()
    state, fold = SchedulerState(), RunFold()
    expected: list[tuple[int, int]] = []
    for seq, e in enumerate(sim.events, 1):
        state.apply(e, seq)
        fold.apply(seq, e)
        if isinstance(e, ExecutionDispatched | ExecutionFinished | CellRegistered | CellRoleChanged):
            expected.append((state.watermark, state.rollout_capacity))
    s = fold.summary()
    assert [(p.watermark, p.rollout_capacity) for p in s.watermark] == expected
    assert {c.cell_id: c.role for c in s.cells} == {c.cell_id: c.role for c in state.cells.values()}
    assert [r.step for r in s.steps] == list(range(1, state.trained_step + 1))
    assert s.executions.finished == state.finished_total and not s.anomalies
    assert any(sp.role == "training-core" for sp in s.cell_spans) and s.time.training_s
    assert s.time.switching_s is not None and s.time.switching_s > 0


def test_what_the_log_does_not_hold_is_said_and_not_drawn() -> None:
    only_skills: list[tuple[int, Event]] = [(1, SkillIngested(skill_id="a", name="a", description="d"))]
    s = fold_events(only_skills)
    assert s.watermark == [] and s.cells == [] and s.steps == [] and s.difficulty == []
    assert (s.time.rollout_s, s.time.training_s, s.time.switching_s, s.time.synthesis_s) == (None, None, None, None)
    joined = " ".join(s.notes)
    for missing in ("execution-dispatched", "cell-registered", "task-synthesized", "training-step-completed"):
        assert missing in joined
    assert fold_events([]).empty
