"""The watermark rule: no cell leaves rollout while that would leave unfinished executions without capacity.

Random orders of dispatches, finishes and role-change requests (from any policy, or an operator) go through
the command layer; whatever it accepts is applied as the protocol's events."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from opengyre.events import CellRegistered, CellRoleChanged, ExecutionDispatched, ExecutionFinished
from opengyre.scheduler import (
    CommandRefused,
    RoleRequest,
    SchedulerState,
    arrival_role,
    check_role_request,
    protocol,
)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("dispatch"), st.integers(1, 6)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("to-training"), st.integers(0, 3)),
        st.tuples(st.just("to-rollout"), st.integers(0, 3)),
    ),
    max_size=120,
)


@settings(max_examples=300, deadline=None)
@given(capacities=st.lists(st.integers(1, 6), min_size=1, max_size=4), ops=OPS)
def test_no_cell_leaves_rollout_below_the_watermark(capacities: list[int], ops: list[tuple[str, int]]) -> None:
    s = SchedulerState()
    for i, cap in enumerate(capacities):
        s.apply(CellRegistered(cell_id=f"c{i}", capacity=cap))
    n = 0
    for op, arg in ops:
        if op == "dispatch":
            for _ in range(arg):
                s.apply(ExecutionDispatched(execution_id=f"x{n}", task_id="t", group_id=f"g{n}"))
                n += 1
            continue
        if op == "finish":
            if s.running:
                xid = sorted(s.running)[arg % len(s.running)]
                s.apply(ExecutionFinished(execution_id=xid, status="completed", score=1.0))
            continue
        cell = f"c{arg % len(capacities)}"
        req = RoleRequest(cell, "training" if op == "to-training" else "rollout", "test")
        before = s.snapshot()
        w, cr, role, cap = s.watermark, s.rollout_capacity, s.cells[cell].role, s.cells[cell].capacity
        try:
            check_role_request(s, req)
        except CommandRefused as exc:
            assert s.snapshot() == before  # a refused command changes nothing
            if req.target == "training" and role == "rollout" and exc.code == "failed-precondition":
                assert w > cr - cap  # refused exactly because of the rule
            continue
        if req.target == "training" and role == "rollout":
            assert w <= cr - cap  # the rule, at the moment the cell starts to leave
        for frm, to in protocol(s, cell, req.target):
            final = arrival_role(s) if to == "training-satellite" else to
            s.apply(CellRoleChanged(cell_id=cell, from_role=frm, to_role=final))
            if frm == "rollout":
                # Every unfinished execution still has a slot on the cells that remain in rollout.
                assert s.watermark <= s.rollout_capacity


def test_last_rollout_cell_with_live_executions_is_refused() -> None:
    s = SchedulerState()
    s.apply(CellRegistered(cell_id="only", capacity=4))
    s.apply(ExecutionDispatched(execution_id="x", task_id="t", group_id="g"))
    try:
        check_role_request(s, RoleRequest("only", "training", "operator"))
    except CommandRefused as exc:
        assert exc.code == "failed-precondition"
        assert "w=1" in exc.message
    else:
        raise AssertionError("the last rollout cell left with an execution live")
    s.apply(ExecutionFinished(execution_id="x", status="completed", score=1.0))
    check_role_request(s, RoleRequest("only", "training", "operator"))  # nothing live: allowed
