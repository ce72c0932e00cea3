"""The simulator's future events, in (time, insertion) order: a calendar queue.

A large run keeps hundreds of thousands of executions' finish events pending; one binary heap over all of them
pays a cache miss at every level of every pop. Here events fall into buckets of ``width`` simulated seconds
(appended, unsorted); only the bucket being drained is a heap, small enough to stay in cache. Pops come out in
exactly the order one heap over ``(time, tie)`` would give.
"""

from __future__ import annotations

import heapq
from typing import Any

__all__ = ["EventQueue"]

Entry = tuple[float, int, int, Any, Any]  # (time, tie, kind, key, payload)


class EventQueue:
    def __init__(self, width: float = 60.0) -> None:
        self.width = width
        self._buckets: dict[int, list[Entry]] = {}
        self._keys: list[int] = []  # heap of bucket indices with entries
        self._now: list[Entry] = []  # the bucket being drained, a heap
        self._now_key = -1
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def push(self, entry: Entry) -> None:
        self._size += 1
        b = int(entry[0] // self.width)
        if b <= self._now_key:  # no event is ever earlier than the one being handled
            heapq.heappush(self._now, entry)
            return
        bucket = self._buckets.get(b)
        if bucket is None:
            self._buckets[b] = [entry]
            heapq.heappush(self._keys, b)
        else:
            bucket.append(entry)

    def _fill(self) -> None:
        while not self._now and self._keys:
            self._now_key = heapq.heappop(self._keys)
            self._now = self._buckets.pop(self._now_key)
            heapq.heapify(self._now)

    def peek_time(self) -> float:
        self._fill()
        return self._now[0][0]

    def pop(self) -> Entry:
        self._fill()
        self._size -= 1
        return heapq.heappop(self._now)
