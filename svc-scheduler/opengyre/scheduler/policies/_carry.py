"""Ours: elastic cells plus partial-rollout carry-over. A training step packs the first complete groups,
whichever batch they were dispatched with, so a step never waits for the slowest group of its own burst; the
stragglers keep running (their harnesses survive, as every execution does here) and a later step trains them.
Dispatch keeps a fixed number of groups in flight, ``groups_per_step * (max_lag + 1) + extra_groups``, so
staleness stays bounded and is measured per sample. Cells still move only under the watermark rule."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import DispatchRequest, Packing, View
from ._elastic import ElasticPolicy

__all__ = ["CarryOverPolicy"]


@dataclass
class CarryOverPolicy(ElasticPolicy):
    name: ClassVar[str] = "elastic-carry"
    summary: ClassVar[str] = "elastic + steps pack the first complete groups; stragglers carry over (ours)"
    packing: ClassVar[Packing] = "fifo"

    extra_groups: int = 8  # groups in flight beyond what the staleness bound would hold

    def dispatch(self, view: View) -> tuple[DispatchRequest, ...]:
        st, loop = view.state, view.loop
        target = loop.groups_per_step * (loop.max_lag + 1) + self.extra_groups
        unconsumed = len(st.groups) - st.consumed_groups
        # Past the run's needs nothing more starts: the last steps drain what is in flight.
        budget = loop.steps * loop.groups_per_step + self.extra_groups - len(st.groups)
        n = min(target - unconsumed, budget, 2 * loop.groups_per_step)
        if n <= 0:
            return ()
        return (DispatchRequest(st.dispatched_step + 1, n),)
