"""Colocate: the whole pool is either rolling out or training; it switches to training only once every
execution of the burst has finished (and the burst's step has all its groups dispatched), and back once
everything ready is trained.

With a resident rollout pool (the paper's C2 ablation: colocate + resident pool + streaming) the same rule is
the watermark rule applied to the whole pool at once: the pool leaves when the unfinished executions fit on
the resident cells, w(t) <= CR(t) - C_pool, and trains as data arrives while the residents finish the tail.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import NOTHING, Decision, Policy, RoleRequest, View, dispatch_only, dispatchable

__all__ = ["ColocatePolicy", "ColocateResidentPolicy"]


def batch_open(view: View) -> bool:
    """The step being dispatched still has groups to come: a client that dispatches group by group as the cells
    free up (the rollout driver) has more of the burst to send, which needs the pool in rollout. Scanned only
    when the pool could otherwise leave."""
    st = view.state
    if not st.dispatched_step:
        return False
    in_batch = sum(1 for g in st.groups.values() if g.step == st.dispatched_step)
    return in_batch < view.loop.groups_per_step


@dataclass
class ColocatePolicy(Policy):
    name: ClassVar[str] = "colocate"
    summary: ClassVar[str] = "whole-pool switching after the slowest execution of the burst (veRL-style)"
    streaming: ClassVar[bool] = False

    def decide(self, view: View) -> Decision:
        st = view.state
        if st.pool_moving_count:
            return NOTHING  # a pool switch is in progress
        if st.training_count:  # residents never train: every training cell is in the pool
            if st.ready_samples == 0:  # everything produced so far is trained
                why = "burst trained; back to rollout"
                return Decision(tuple(RoleRequest(c.cell_id, "rollout", why) for c in st.training_cells_reversed()))
            return NOTHING
        leaving = st.pool_rollout_capacity
        if st.ready_samples > 0 and st.watermark <= st.rollout_capacity - leaving and not batch_open(view):
            why = "the burst's unfinished executions fit on the resident pool" if leaving < st.rollout_capacity else (
                "every execution of the burst finished")  # fmt: skip
            return Decision(tuple(RoleRequest(c.cell_id, "training", why) for c in st.rollout_pool_cells()))
        if st.ready_samples == 0:
            return dispatch_only(dispatchable(view))  # a new burst: every step the staleness bound admits
        return NOTHING


@dataclass
class ColocateResidentPolicy(ColocatePolicy):
    """The paper's C2: a resident rollout pool finishes the tail while the rest trains, streaming."""

    name: ClassVar[str] = "colocate-resident"
    summary: ClassVar[str] = "whole-pool switching with a resident rollout pool and streaming (the paper's C2)"
    streaming: ClassVar[bool] = True
