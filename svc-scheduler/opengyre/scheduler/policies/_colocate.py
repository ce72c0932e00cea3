"""Colocate: the whole pool is either rolling out or training; it switches to training only after every
execution of the burst has finished, and back once everything ready is trained."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import Decision, Policy, RoleRequest, View, dispatchable
from .._rules import TRAINING_ROLES

__all__ = ["ColocatePolicy"]


@dataclass
class ColocatePolicy(Policy):
    name: ClassVar[str] = "colocate"
    summary: ClassVar[str] = "whole-pool switching after the slowest execution of the burst (veRL-style)"
    streaming: ClassVar[bool] = False

    def decide(self, view: View) -> Decision:
        st = view.state
        pool = [c for c in st.cells_in_order() if not c.resident]
        if any(c.role in ("draining", "switching") for c in pool):
            return Decision()  # a pool switch is in progress
        training = [c for c in pool if c.role in TRAINING_ROLES]
        if training:
            if st.ready_samples == 0:  # everything the burst produced is trained
                why = "burst trained; back to rollout"
                return Decision(tuple(RoleRequest(c.cell_id, "rollout", why) for c in reversed(training)))
            return Decision()
        if st.watermark == 0 and st.ready_samples > 0:
            why = "every execution of the burst finished"
            return Decision(tuple(RoleRequest(c.cell_id, "training", why) for c in pool if c.role == "rollout"))
        if st.watermark == 0 and st.ready_samples == 0:
            return Decision((), dispatchable(view))  # a new burst: every step the staleness bound admits
        return Decision()
