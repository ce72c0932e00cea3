"""Where running executions sit: the rollout cells' slots, least-loaded first, as the proxy routes.

The proxy sends an execution's first call to the engine with the fewest requests in flight and keeps it there
(prefix-cache affinity); when the engine drains, each of its executions moves to the least-loaded engine left.
Cells are kept in buckets by load, each bucket sorted by registration order, so a placement, a finish and a
move cost O(log cells) and not a scan of every cell.
"""

from __future__ import annotations

from bisect import bisect_left, insort

__all__ = ["Slots"]


class Slots:
    def __init__(self) -> None:
        self._load: dict[str, int] = {}  # open (rollout) cells only
        self._capacity: dict[str, int] = {}
        self._order: dict[str, int] = {}
        self._gpus_per_slot: dict[str, float] = {}
        self._buckets: dict[int, list[tuple[int, str]]] = {}  # load -> [(order, cell)], sorted
        self._min = 0  # no open cell has a load below this
        self._on: dict[str, dict[str, None]] = {}  # cell -> executions on it, in placement order
        self._where: dict[str, str] = {}  # execution -> cell
        self.busy = 0  # executions placed
        self.busy_gpus = 0.0  # GPUs their slots stand for

    def _move_bucket(self, cell: str, old: int | None, new: int | None) -> None:
        key = (self._order[cell], cell)
        if old is not None:
            b = self._buckets[old]
            del b[bisect_left(b, key)]
            if not b:
                del self._buckets[old]
        if new is not None:
            insort(self._buckets.setdefault(new, []), key)
            self._min = min(self._min, new)

    def open(self, cell: str, order: int, capacity: int, gpus: int) -> None:
        """The cell takes executions (it arrived in rollout)."""
        if cell in self._load:
            return
        self._order[cell] = order
        self._capacity[cell] = capacity
        self._gpus_per_slot[cell] = gpus / capacity if capacity else 0.0
        self._load[cell] = 0
        self._on[cell] = {}
        self._move_bucket(cell, None, 0)

    def close(self, cell: str) -> list[str]:
        """The cell stops taking executions (it leaves rollout); returns the executions that were on it."""
        load = self._load.pop(cell, None)
        if load is None:
            return []
        self._move_bucket(cell, load, None)
        moved = list(self._on.pop(cell))
        for xid in moved:
            del self._where[xid]
        self.busy -= len(moved)
        self.busy_gpus -= len(moved) * self._gpus_per_slot[cell]
        return moved

    def place(self, xid: str) -> str | None:
        """Put ``xid`` on the least-loaded open cell with a free slot (ties: the first registered)."""
        while self._buckets and self._min not in self._buckets:
            self._min += 1
        if not self._buckets:
            return None
        _, cell = self._buckets[self._min][0]
        load = self._load[cell]
        if load >= self._capacity[cell]:
            return None  # every cell is full (equal capacities: the least loaded is full)
        self._load[cell] = load + 1
        self._move_bucket(cell, load, load + 1)
        self._on[cell][xid] = None
        self._where[xid] = cell
        self.busy += 1
        self.busy_gpus += self._gpus_per_slot[cell]
        return cell

    def remove(self, xid: str) -> None:
        cell = self._where.pop(xid)
        del self._on[cell][xid]
        load = self._load[cell]
        self._load[cell] = load - 1
        self._move_bucket(cell, load, load - 1)
        self.busy -= 1
        self.busy_gpus -= self._gpus_per_slot[cell]

    def gpus_per_slot(self, cell: str) -> float:
        return self._gpus_per_slot[cell]

    def has_room(self) -> bool:
        while self._buckets and self._min not in self._buckets:
            self._min += 1
        if not self._buckets:
            return False
        _, cell = self._buckets[self._min][0]
        return self._load[cell] < self._capacity[cell]
