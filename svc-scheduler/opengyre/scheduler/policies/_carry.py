"""Ours: elastic cells plus partial-rollout carry-over. A training step packs the first complete groups,
whichever batch they were dispatched with, so a step never waits for the slowest group of its own burst; the
stragglers keep running (their harnesses survive, as every execution does here) and a later step trains them.

Dispatch keeps ``groups_per_step + extra_groups`` groups live (in flight, or complete and waiting), refilled as
steps consume them. By default that is enough to fill every cell's rollout slots, and never less than 7/4 of
a batch. No sample is trained staler than ``max_staleness`` (default: the loop's bound phi, the same maximum
staleness the other policies have); a group that would be is dropped (its work is lost and counted). Cells
still move only under the watermark rule, exactly as in ``elastic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .._policy import DispatchRequest, LoopConfig, Packing, View
from ._elastic import ElasticPolicy

__all__ = ["CarryOverPolicy"]


@dataclass
class CarryOverPolicy(ElasticPolicy):
    name: ClassVar[str] = "elastic-carry"
    summary: ClassVar[str] = "elastic + steps pack the first complete groups; stragglers carry over (ours)"
    packing: ClassVar[Packing] = "fifo"

    extra_groups: int | None = None  # live groups beyond one step's batch (default: see the module doc)
    max_staleness: int | None = None  # default: the loop's bound phi

    def staleness_cap(self, loop: LoopConfig) -> int | None:
        return loop.max_lag if self.max_staleness is None else self.max_staleness

    def extra(self, loop: LoopConfig, slots: int) -> int:
        if self.extra_groups is not None:
            return self.extra_groups
        # Fill the cells' slots, and at least 3/4 of a batch of slack: on the calibrated workload the fastest
        # settings at equal maximum staleness, both where slots are scarce and where they are plentiful (bench/).
        return max(-(-3 * loop.groups_per_step // 4), slots // loop.group_size - loop.groups_per_step)

    def dispatch(self, view: View) -> tuple[DispatchRequest, ...]:
        st, loop = view.state, view.loop
        slots = sum(c.capacity for c in st.cells.values())
        extra, cap = self.extra(loop, slots), self.staleness_cap(loop)
        target = loop.groups_per_step + extra
        live = len(st.groups) - st.consumed_groups  # in flight, or complete and waiting to be packed
        if cap is not None:
            # Complete groups already too stale for the next step will never be trained: not live any more.
            live -= sum(1 for g in st.ready_groups() if st.trained_step - g.version_step > cap)
        # Never more than the remaining steps can use (plus the slack): the last steps drain what is in flight.
        need = (loop.steps - st.trained_step) * loop.groups_per_step + extra - live
        n = min(target - live, need, 2 * loop.groups_per_step)
        if n <= 0:
            return ()
        return (DispatchRequest(st.dispatched_step + 1, n),)
