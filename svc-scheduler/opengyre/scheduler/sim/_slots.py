"""Where running executions sit: the rollout cells' slots, least-loaded first, as the proxy routes.

The proxy sends an execution's first call to the engine with the fewest requests in flight and keeps it there
(prefix-cache affinity); when the engine drains, each of its executions moves to the least-loaded engine left.
Cells sit in a heap keyed (load, registration order); an entry whose load is no longer the cell's is skipped
when it surfaces, so a placement, a finish and a move cost O(log cells) and not a scan of every cell. A finish
only marks its cell: the cell's new entry goes onto the heap when the next placement looks, once however many
of its executions finished in between (most finishes happen while nothing waits for a slot).
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator
from typing import Generic, TypeVar

__all__ = ["Slots"]

K = TypeVar("K", bound=Hashable)


class Slots(Generic[K]):
    """Slots holding executions of any hashable kind (the simulator's own records: no second map to them)."""

    def __init__(self) -> None:
        self._load: dict[str, int] = {}  # open (rollout) cells only
        self._capacity: dict[str, int] = {}
        self._order: dict[str, int] = {}
        self._gpus_per_slot: dict[str, float] = {}
        self._heap: list[tuple[int, int, str]] = []  # (load, order, cell); stale entries are skipped
        self._dirty: dict[str, None] = {}  # cells whose load fell since their last heap entry
        self._on: dict[str, dict[K, None]] = {}  # cell -> executions on it, in placement order
        self.busy = 0  # executions placed
        self.busy_gpus = 0.0  # GPUs their slots stand for

    def _push(self, cell: str, load: int) -> None:
        heapq.heappush(self._heap, (load, self._order[cell], cell))
        if len(self._heap) > 4 * len(self._load) + 64:  # drop the stale entries now and then
            self._heap = [(n, self._order[c], c) for c, n in self._load.items()]
            heapq.heapify(self._heap)

    def _least(self) -> str | None:
        loads = self._load
        if self._dirty:
            for cell in self._dirty:
                load = loads.get(cell)
                if load is not None:  # closed since: no entry
                    self._push(cell, load)
            self._dirty.clear()
        heap = self._heap  # after the pushes: one may have rebuilt it
        while heap:
            load, _, cell = heap[0]
            if loads.get(cell) == load:
                return cell
            heapq.heappop(heap)
        return None

    def open(self, cell: str, order: int, capacity: int, gpus: int) -> None:
        """The cell takes executions (it arrived in rollout)."""
        if cell in self._load:
            return
        self._order[cell] = order
        self._capacity[cell] = capacity
        self._gpus_per_slot[cell] = gpus / capacity if capacity else 0.0
        self._load[cell] = 0
        self._on[cell] = {}
        self._push(cell, 0)

    def close(self, cell: str) -> list[K]:
        """The cell stops taking executions (it leaves rollout); returns the executions that were on it."""
        if self._load.pop(cell, None) is None:
            return []
        moved = list(self._on.pop(cell))
        self.busy -= len(moved)
        self.busy_gpus -= len(moved) * self._gpus_per_slot[cell]
        return moved

    def place(self, xid: K) -> str | None:
        """Put ``xid`` on the least-loaded open cell with a free slot (ties: the first registered)."""
        heap = self._heap
        # ``_least`` without the call when nothing is pending and the top is current (a burst's placements).
        fast = not self._dirty and heap and self._load.get(heap[0][2]) == heap[0][0]
        cell = heap[0][2] if fast else self._least()
        if cell is None:
            return None
        load = self._load[cell]
        if load >= self._capacity[cell]:
            return None  # every cell is full (equal capacities: the least loaded is full)
        self._load[cell] = load + 1
        # The cell's entry is the heap's top (``_least`` found it there): replace it, one sift, no stale entry.
        heapq.heapreplace(self._heap, (load + 1, self._order[cell], cell))
        self._on[cell][xid] = None
        self.busy += 1
        self.busy_gpus += self._gpus_per_slot[cell]
        return cell

    def remove(self, xid: K, cell: str) -> float:
        """Take ``xid`` off ``cell`` (where ``place`` put it); returns the GPUs its slot stood for."""
        del self._on[cell][xid]
        self._load[cell] -= 1
        self._dirty[cell] = None
        per_slot = self._gpus_per_slot[cell]
        self.busy -= 1
        self.busy_gpus -= per_slot
        return per_slot

    def placed(self) -> Iterator[K]:
        """Every execution on a cell, cell by cell."""
        for on in self._on.values():
            yield from on

    def gpus_per_slot(self, cell: str) -> float:
        return self._gpus_per_slot[cell]
