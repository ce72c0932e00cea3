"""Dispatch: the scheduler places groups of executions on rollout cells and appends ``execution-dispatched``.

A pure planner over the state (which step the groups go to, which cell holds each member) and the events it
implies; the controller judges and appends them under its lock, so a cell cannot start draining between the
check and the append. The step is the batch in progress while it has room, else the first one the policy's
staleness bound lets start now (``Decision.dispatch``); a cell holds at most ``capacity`` running executions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opengyre.events import ExecutionDispatched

from ._commands import CommandRefused
from ._policy import Decision, LoopConfig
from ._state import SchedulerState

__all__ = ["GroupAsk", "Placement", "check_asks", "dispatch_event_id", "latest_version", "plan_dispatch"]


@dataclass(frozen=True)
class GroupAsk:
    group_id: str
    task_id: str
    task_version: int
    group_size: int


@dataclass(frozen=True)
class Placement:
    step: int
    weight_version: str
    events: tuple[ExecutionDispatched, ...]


def dispatch_event_id(execution_id: str) -> str:
    """Derived from the execution, so an append retried after a lost acknowledgement is stored once."""
    return f"scheduler-dispatch-{execution_id}"


def latest_version(st: SchedulerState) -> str:
    """The weights the next rollouts are generated with: the last published version ("default" before any)."""
    if not st.versions:
        return "default"
    return max(st.versions.items(), key=lambda kv: kv[1])[0]


def _step_for(st: SchedulerState, advice: Decision, loop: LoopConfig, n_groups: int) -> int:
    current = st.dispatched_step
    in_batch = sum(1 for g in st.groups.values() if g.step == current) if current else 0
    if current and in_batch < loop.groups_per_step:
        if n_groups > loop.groups_per_step - in_batch:
            raise CommandRefused(
                "failed-precondition",
                f"step {current} has room for {loop.groups_per_step - in_batch} more group(s), not {n_groups}",
            )
        return current
    if not advice.dispatch:
        raise CommandRefused(
            "failed-precondition",
            f"the policy starts no batch now (dispatched step {current}, trained step {st.trained_step})",
        )
    if n_groups > loop.groups_per_step:
        raise CommandRefused("failed-precondition", f"a step holds {loop.groups_per_step} group(s), not {n_groups}")
    return advice.dispatch[0].step


def check_asks(asks: Sequence[GroupAsk]) -> None:
    if not asks:
        raise CommandRefused("invalid-argument", "no groups to dispatch")
    for a in asks:
        if not a.group_id or not a.task_id or a.group_size < 1:
            raise CommandRefused("invalid-argument", f"group {a.group_id!r}: group_id, task_id and a size are required")
    if len({a.group_id for a in asks}) < len(asks):
        raise CommandRefused("invalid-argument", "a group_id appears twice in one request")


def plan_dispatch(
    st: SchedulerState,
    advice: Decision,
    loop: LoopConfig,
    asks: Sequence[GroupAsk],
    running_by_cell: Mapping[str, int],
    timeout_s: float,
) -> Placement:
    """The step and the members' cells for ``asks`` (new groups only), or CommandRefused saying why not now."""
    check_asks(asks)
    step = _step_for(st, advice, loop, len(asks))
    free = {
        c.cell_id: c.capacity - running_by_cell.get(c.cell_id, 0)
        for c in st.cells_in_order()
        if c.role == "rollout" and c.capacity > running_by_cell.get(c.cell_id, 0)
    }
    need = sum(a.group_size for a in asks)
    if sum(free.values()) < need:
        raise CommandRefused(
            "resource-exhausted", f"{need} execution(s) asked, {sum(free.values())} free slot(s) on rollout cells"
        )
    version = latest_version(st)
    events: list[ExecutionDispatched] = []
    for a in asks:
        for i in range(a.group_size):
            cell = max(free, key=lambda c: free[c])  # the least loaded cell (first registered on a tie)
            free[cell] -= 1
            eid = f"{a.group_id}-m{i}"
            events.append(
                ExecutionDispatched(
                    event_id=dispatch_event_id(eid),
                    execution_id=eid,
                    task_id=a.task_id,
                    group_id=a.group_id,
                    task_version=a.task_version,
                    step=step,
                    weight_version=version,
                    timeout_s=timeout_s,
                    cell_id=cell,
                    group_size=a.group_size,
                )
            )
    return Placement(step, version, tuple(events))
