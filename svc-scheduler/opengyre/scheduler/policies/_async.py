"""Async: a fixed split, the first ``train_cells`` cells train for the whole run and the rest roll out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import Decision, Policy, RoleRequest, View, dispatch_only, dispatchable

__all__ = ["AsyncPolicy", "AsyncStreamingPolicy"]


@dataclass
class AsyncPolicy(Policy):
    name: ClassVar[str] = "async"
    summary: ClassVar[str] = "fixed rollout pool and training pool; a step trains once its batch is whole"
    streaming: ClassVar[bool] = False

    train_cells: int = 2

    def decide(self, view: View) -> Decision:
        st = view.state
        pool = st.pool
        # At least one cell keeps rolling out (with a resident pool, every elastic cell may train).
        k = min(self.train_cells, len(pool) - (0 if len(pool) < len(st.cells) else 1))
        first = st.first_rollout_pool_cell()
        if first is None or st.pool_rank(first) >= k:
            return dispatch_only(dispatchable(view))  # the first k cells of the pool all left rollout
        why = f"fixed training pool of {self.train_cells}"
        roles: list[RoleRequest] = []
        for c in st.rollout_pool_cells():
            if st.pool_rank(c) >= k:
                break
            roles.append(RoleRequest(c.cell_id, "training", why))
        return Decision(tuple(roles), dispatchable(view))


@dataclass
class AsyncStreamingPolicy(AsyncPolicy):
    """The paper's A3 ablation: the async split with streaming training (micro-steps as groups complete)."""

    name: ClassVar[str] = "async-streaming"
    summary: ClassVar[str] = "fixed split plus streaming micro-steps (the paper's A3)"
    streaming: ClassVar[bool] = True
