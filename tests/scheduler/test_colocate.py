"""Colocate with a step dispatched group by group (the rollout driver sends each group once the cells have room):
the pool stays in rollout until the step's last group is out, else it could leave between two groups and the
step would wait for a group that no rollout cell is left to take."""

from __future__ import annotations

from opengyre.events import CellRegistered, ExecutionDispatched, ExecutionFinished
from opengyre.scheduler import LoopConfig, SchedulerState, View
from opengyre.scheduler.policies import make_policy


def _group(state: SchedulerState, group: str) -> None:
    for i in range(2):
        x = f"{group}-m{i}"
        state.apply(ExecutionDispatched(execution_id=x, task_id="t", group_id=group, step=1, group_size=2))
        state.apply(ExecutionFinished(execution_id=x, status="completed", score=float(i)))


def test_the_pool_leaves_only_once_the_steps_last_group_is_out() -> None:
    policy, loop = make_policy("colocate"), LoopConfig(steps=1, groups_per_step=2, group_size=2, max_lag=0)
    state = SchedulerState()
    for c in ("c0", "c1"):
        state.apply(CellRegistered(cell_id=c, capacity=2))
    _group(state, "s1-g0")  # finished and ready: w = 0, but the step has one group to come
    assert policy.decide(View(state, 0.0, loop)).roles == ()
    _group(state, "s1-g1")
    roles = policy.decide(View(state, 0.0, loop)).roles
    assert sorted((r.cell_id, r.target) for r in roles) == [("c0", "training"), ("c1", "training")]
