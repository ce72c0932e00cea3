"""QwenGyre's elastic policy: cells turn to training one by one, a growing prefix, while the watermark rule
w(t) <= CR(t) - Ce holds and ready data keeps up; they come back when the next burst needs them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import (
    Decision,
    DispatchRequest,
    Packing,
    Policy,
    RoleRequest,
    View,
    dispatch_only,
    dispatchable,
    ready_microsteps,
)
from .._rules import watermark_allows

__all__ = ["ElasticPolicy"]


@dataclass
class ElasticPolicy(Policy):
    name: ClassVar[str] = "elastic"
    summary: ClassVar[str] = "cells turn to training one by one under w(t) <= CR(t) - Ce (QwenGyre)"
    packing: ClassVar[Packing] = "batch"

    # A cell turns only while the ready buffer holds this many micro-steps per training cell (itself included).
    ready_per_cell: int = 1

    def decide(self, view: View) -> Decision:
        st, loop = view.state, view.loop
        dispatch = self.dispatch(view)
        # Rollouts about to be dispatched are demand already: bring cells back before the burst queues.
        demand = st.watermark + (sum(d.groups for d in dispatch) * loop.group_size if dispatch else 0)
        supply = st.rollout_capacity + st.heading_to_rollout_capacity
        if demand > supply:
            back: list[RoleRequest] = []
            for c in st.training_cells_reversed():  # the prefix shrinks from its end; the core leaves last
                if supply >= demand:
                    break
                back.append(RoleRequest(c.cell_id, "rollout", f"burst needs capacity: w={demand} > CR={supply}"))
                supply += c.capacity
            return Decision(tuple(back), dispatch)
        if st.heading_to_training_count:
            return dispatch_only(dispatch)  # one cell at a time
        nxt = st.first_rollout_pool_cell()
        if nxt is None:
            return dispatch_only(dispatch)
        if not watermark_allows(demand, st.rollout_capacity, nxt.capacity):
            return dispatch_only(dispatch)
        ready = ready_microsteps(view)
        need = self.ready_per_cell * (st.training_count + 1)
        if not st.training_count:
            # The first cell turns once a whole step is ready: a step of fewer micro-steps than the threshold
            # would never reach it, and with no training cell nothing is ever trained (the run stalls).
            need = min(need, loop.microsteps_per_step)
        if ready < need:
            return dispatch_only(dispatch)
        why = f"w={demand} <= CR-Ce={st.rollout_capacity - nxt.capacity}; ready={ready}"
        return Decision((RoleRequest(nxt.cell_id, "training", why),), dispatch)

    def dispatch(self, view: View) -> tuple[DispatchRequest, ...]:
        return dispatchable(view)
