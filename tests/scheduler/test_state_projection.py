"""The in-memory fold and the SQL projection are the same function of the log: same rejections, same state."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from sqlalchemy import Engine, delete

from opengyre.events import CellRegistered, CellRoleChanged, Event, ExecutionDispatched, ExecutionFinished
from opengyre.projection import Rejected
from opengyre.scheduler import SchedulerProjection, SchedulerState, load_state

from .conftest import scheduler_events


def _fold_both(engine: Engine, events: list[Event]) -> tuple[SchedulerState, SchedulerState, list[str]]:
    proj = SchedulerProjection()
    mem = SchedulerState()
    with engine.begin() as tx:
        for t in proj.tables:
            tx.execute(delete(t))
    outcomes: list[str] = []
    with engine.begin() as tx:
        for seq, e in enumerate(events, 1):
            a = b = "ok"
            try:
                mem.apply(e, seq)
            except Rejected as exc:
                a = str(exc)
            try:
                with tx.begin_nested():
                    proj.apply(tx, e, seq)
            except Rejected as exc:
                b = str(exc)
            assert a == b, (seq, e, a, b)
            outcomes.append(a)
    with engine.connect() as conn:
        sql = load_state(conn, projection="none")
    return mem, sql, outcomes


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=scheduler_events())
def test_sql_projection_equals_in_memory_fold(engine: Engine, events: list[Event]) -> None:
    mem, sql, _ = _fold_both(engine, events)
    assert sql.snapshot() == mem.snapshot()


def test_rejections_are_the_documented_ones(engine: Engine) -> None:
    events: list[Event] = [
        CellRegistered(cell_id="c0", capacity=2),
        CellRegistered(cell_id="c0", capacity=2),
        CellRoleChanged(cell_id="c9", from_role="rollout", to_role="draining"),
        CellRoleChanged(cell_id="c0", from_role="rollout", to_role="training-core"),
        CellRoleChanged(cell_id="c0", from_role="idle", to_role="rollout"),
        ExecutionFinished(execution_id="x0", status="completed", score=1.0),
        ExecutionDispatched(execution_id="x0", task_id="t", group_id="g"),
        ExecutionDispatched(execution_id="x0", task_id="t", group_id="g"),
        ExecutionFinished(execution_id="x0", status="completed", score=1.0),
        ExecutionFinished(execution_id="x0", status="completed", score=1.0),
    ]
    mem, sql, outcomes = _fold_both(engine, events)
    assert outcomes == [
        "ok",
        "cell c0 is already registered",
        "cell c9 is not registered",
        "cell c0: rollout -> training-core is not a step of the role-change protocol",
        "cell c0 is rollout, not idle",
        "execution x0 finished but was never dispatched",
        "ok",
        "execution x0 was already dispatched",
        "ok",
        "execution x0 already finished",
    ]
    assert mem.watermark == 0 and mem.rollout_capacity == 2
    assert sql.snapshot() == mem.snapshot()
