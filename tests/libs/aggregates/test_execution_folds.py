"""One rule for an execution: every fold of execution events (the scheduler's state and SQL projection, the
trainer's projection, the report) takes the same event sequences to the same executions and refuses the same
events as the pure ``evolve_execution`` does."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, select

from opengyre.aggregates import Execution, ExecutionEvent, evolve_execution
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.projection import Projection, Rejected
from opengyre.report import RunFold
from opengyre.scheduler import SchedulerProjection, SchedulerState, load_state
from opengyre.trainer import TrainerProjection

from ._reference import fold_reference


def _d(x: str, group: str = "g") -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=x, task_id="t", group_id=group, group_size=2)


def _f(x: str, status: str = "completed", score: float | None = 1.0, calls: int | None = None) -> ExecutionFinished:
    return ExecutionFinished(execution_id=x, status=status, score=score, recorded_calls=calls)  # type: ignore[arg-type]


SEQUENCES: dict[str, list[ExecutionEvent]] = {
    "a-group": [_d("a"), _d("b"), _f("a"), _f("b", "evaluator-failed", None)],
    "twice": [_d("a"), _d("a"), _f("a"), _f("a", score=0.0)],
    "refusals": [
        _f("ghost"),
        _d("a"),
        _d("b"),
        _d("c"),
        _d("d"),
        _f("a", score=float("nan")),
        _f("b", "infra-failed", 0.5),
        _f("c", calls=-1),
        _f("d", "timeout", 0.0, calls=3),
        _f("a", score=0.25),
    ],
}


@dataclass(frozen=True)
class Outcome:
    finished: dict[str, bool]  # execution -> finished
    refused: list[int]


def reference(events: Sequence[ExecutionEvent]) -> tuple[dict[str, Execution], list[int]]:
    ref = fold_reference(evolve_execution, lambda e: e.execution_id, events)
    return ref.views, ref.refused


def scheduler_state(events: Sequence[ExecutionEvent], engine: Engine) -> Outcome:
    st, refused = SchedulerState(), []
    for seq, e in enumerate(events, 1):
        try:
            st.apply(e, seq)
        except Rejected:
            refused.append(seq)
    return Outcome({**dict.fromkeys(st.running, False), **dict.fromkeys(st.finished, True)}, refused)


def _sql(projection: Projection, events: Sequence[ExecutionEvent], engine: Engine) -> list[int]:
    refused = []
    for seq, e in enumerate(events, 1):
        try:
            with engine.begin() as tx:  # a refused event rolls its transaction back, as the runner's does
                projection.apply(tx, e, seq)
        except Rejected:
            refused.append(seq)
    return refused


def scheduler_sql(events: Sequence[ExecutionEvent], engine: Engine) -> Outcome:
    refused = _sql(SchedulerProjection(), events, engine)
    with engine.connect() as conn:
        st = load_state(conn)
    return Outcome({**dict.fromkeys(st.running, False), **dict.fromkeys(st.finished, True)}, refused)


def trainer_sql(events: Sequence[ExecutionEvent], engine: Engine) -> Outcome:
    projection = TrainerProjection()
    refused = _sql(projection, events, engine)
    (table,) = [t for t in projection.tables if t.name == "trainer_executions"]
    with engine.connect() as conn:
        rows = conn.execute(select(table.c.execution_id, table.c.status)).all()
    return Outcome({r.execution_id: r.status != "running" for r in rows}, refused)


def report(events: Sequence[ExecutionEvent], engine: Engine) -> Outcome:
    fold, refused = RunFold(), []
    for seq, e in enumerate(events, 1):
        before = sum(fold.anomalies.values())
        fold.apply(seq, e)
        if sum(fold.anomalies.values()) != before:
            refused.append(seq)
    return Outcome({x: v.finished_at is not None for x, v in fold.execs.items()}, refused)


FOLDS: dict[str, Callable[[Sequence[ExecutionEvent], Engine], Outcome]] = {
    "scheduler-state": scheduler_state,
    "scheduler-sql": scheduler_sql,
    "trainer-sql": trainer_sql,
    "report": report,
}


@pytest.mark.parametrize("sequence", list(SEQUENCES))
@pytest.mark.parametrize("fold", list(FOLDS))
def test_every_fold_of_execution_events_agrees_with_the_execution_aggregate(
    fold: str, sequence: str, engine: Engine
) -> None:
    events = SEQUENCES[sequence]
    xs, refused = reference(events)
    got = FOLDS[fold](events, engine)
    assert got.refused == refused
    assert got.finished == {k: x.finished for k, x in xs.items()}


def test_the_sequences_exercise_every_refusal() -> None:
    reasons = set()
    for events in SEQUENCES.values():
        reasons |= fold_reference(evolve_execution, lambda e: e.execution_id, events).reasons
    assert reasons == {
        "duplicate-execution", "unknown-execution", "already-finished", "invalid-score", "invalid-call-count",
        "score-on-failure",
    }  # fmt: skip
