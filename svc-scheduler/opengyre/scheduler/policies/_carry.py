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
    max_staleness: int | None = None  # never train a group staler than this (it is dropped, its work lost)

    @property
    def staleness_cap(self) -> int | None:
        return self.max_staleness

    def dispatch(self, view: View) -> tuple[DispatchRequest, ...]:
        st, loop = view.state, view.loop
        target = loop.groups_per_step * (loop.max_lag + 1) + self.extra_groups
        live = len(st.groups) - st.consumed_groups  # in flight, or complete and waiting to be packed
        if self.max_staleness is not None:
            # Complete groups already too stale for the next step will never be trained: not live any more.
            live -= sum(1 for g in st.ready_groups() if st.trained_step - g.version_step > self.max_staleness)
        # Never more than the remaining steps can use (plus the slack): the last steps drain what is in flight.
        need = (loop.steps - st.trained_step) * loop.groups_per_step + self.extra_groups - live
        n = min(target - live, need, 2 * loop.groups_per_step)
        if n <= 0:
            return ()
        return (DispatchRequest(st.dispatched_step + 1, n),)
