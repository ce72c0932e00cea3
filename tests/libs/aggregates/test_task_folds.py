"""One rule for a task: both folds of task events (synth's task catalogue, the report) take the same event
sequences to the same task versions and refuse the same events as the pure ``evolve_task`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from sqlalchemy import Engine, select

from opengyre.aggregates import Task, TaskEvent, evolve_task
from opengyre.events import TaskHardened, TaskSynthesized, TaskTooEasy, TaskValidated
from opengyre.projection import Rejected
from opengyre.report import RunFold
from opengyre.synth import TasksProjection

from ._reference import fold_reference

SEQUENCES: dict[str, list[TaskEvent]] = {
    "harden-twice": [
        TaskSynthesized(task_id="t", skill_id="s"),
        TaskValidated(task_id="t", ok=True),
        TaskTooEasy(task_id="t", mean_reward=1.0, n_samples=8),
        TaskHardened(task_id="t", from_version=1, to_version=2),
        TaskValidated(task_id="t", task_version=2, ok=True),
        TaskHardened(task_id="t", from_version=2, to_version=3),
    ],
    "refusals": [
        TaskValidated(task_id="ghost", ok=True),
        TaskTooEasy(task_id="ghost", mean_reward=1.0, n_samples=8),
        TaskSynthesized(task_id="t", skill_id="s"),
        TaskSynthesized(task_id="t", skill_id="s", task_version=2),  # synthesized once
        TaskValidated(task_id="t", task_version=5, ok=True),
        TaskTooEasy(task_id="t", task_version=5, mean_reward=1.0, n_samples=8),
        TaskHardened(task_id="t", from_version=1, to_version=1),
        TaskHardened(task_id="t", from_version=1, to_version=2),
        TaskHardened(task_id="t", from_version=1, to_version=3),  # v1 is no longer current
        TaskHardened(task_id="ghost", from_version=1, to_version=2),
    ],
}

Outcome = tuple[dict[str, list[int]], list[int]]  # task -> its versions; the seqs refused


def reference(events: Sequence[TaskEvent]) -> tuple[dict[str, Task], list[int]]:
    ref = fold_reference(evolve_task, lambda e: e.task_id, events)
    return ref.views, ref.refused


def synth_sql(events: Sequence[TaskEvent], engine: Engine) -> Outcome:
    projection, refused = TasksProjection(), []
    for seq, e in enumerate(events, 1):
        try:
            with engine.begin() as tx:  # a refused event rolls its transaction back, as the runner's does
                projection.apply(tx, e, seq)
        except Rejected:
            refused.append(seq)
    (table,) = [t for t in projection.tables if t.name == "synth_task_versions"]
    versions: dict[str, list[int]] = {}
    with engine.connect() as conn:
        for r in conn.execute(select(table.c.task_id, table.c.version).order_by(table.c.version)):
            versions.setdefault(r.task_id, []).append(r.version)
    return versions, refused


def report(events: Sequence[TaskEvent], engine: Engine) -> Outcome:
    fold, refused = RunFold(), []
    for seq, e in enumerate(events, 1):
        before = sum(fold.anomalies.values())
        fold.apply(seq, e)
        if sum(fold.anomalies.values()) != before:
            refused.append(seq)
    return {k: sorted(t.versions) for k, t in fold.tasks.items()}, refused


FOLDS: dict[str, Callable[[Sequence[TaskEvent], Engine], Outcome]] = {"synth-sql": synth_sql, "report": report}


@pytest.mark.parametrize("sequence", list(SEQUENCES))
@pytest.mark.parametrize("fold", list(FOLDS))
def test_every_fold_of_task_events_agrees_with_the_task_aggregate(fold: str, sequence: str, engine: Engine) -> None:
    events = SEQUENCES[sequence]
    tasks, refused = reference(events)
    versions, got_refused = FOLDS[fold](events, engine)
    assert got_refused == refused
    assert versions == {k: sorted(t.versions) for k, t in tasks.items()}


def test_the_sequences_exercise_every_refusal() -> None:
    reasons = set()
    for events in SEQUENCES.values():
        reasons |= fold_reference(evolve_task, lambda e: e.task_id, events).reasons
    assert reasons == {
        "duplicate-task",
        "unknown-task",
        "unknown-task-version",
        "stale-version",
        "duplicate-task-version",
    }
