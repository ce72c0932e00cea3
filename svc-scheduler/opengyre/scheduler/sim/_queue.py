"""The simulator's future events, in (time, insertion) order: a calendar queue.

A large run keeps hundreds of thousands of executions' finish events pending; one binary heap over all of them
pays a cache miss at every level of every pop. Here events fall into buckets of ``width`` simulated seconds
(appended, unsorted). The bucket being drained is sorted once (in C) and popped from its end; the few events
pushed into it afterwards (a moved execution's new finish, a switch or micro-step ending soon) go to a small
heap beside it, and a pop takes the smaller head of the two. Pops come out in exactly the order one heap over
``(time, tie)`` would give.
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
        self._now: list[Entry] = []  # the bucket being drained, sorted latest first
        self._late: list[Entry] = []  # a heap: entries pushed into that bucket after it was sorted
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
            heapq.heappush(self._late, entry)
            return
        bucket = self._buckets.get(b)
        if bucket is None:
            self._buckets[b] = [entry]
            heapq.heappush(self._keys, b)
        else:
            bucket.append(entry)

    def _fill(self) -> None:
        if not self._now and not self._late and self._keys:
            self._now_key = heapq.heappop(self._keys)
            self._now = self._buckets.pop(self._now_key)
            self._now.sort(reverse=True)

    def pop(self) -> Entry:
        self._fill()
        self._size -= 1
        now, late = self._now, self._late
        if late and (not now or late[0] < now[-1]):
            return heapq.heappop(late)
        return now.pop()

    def pop_at(self, t: float) -> Entry | None:
        """The next entry if it is due at exactly ``t`` (the instant being handled), else None."""
        if not self._size:
            return None
        now, late = self._now, self._late
        if not now and not late:
            self._fill()
            now, late = self._now, self._late
        if late and (not now or late[0] < now[-1]):
            if late[0][0] != t:
                return None
            self._size -= 1
            return heapq.heappop(late)
        if now[-1][0] != t:
            return None
        self._size -= 1
        return now.pop()
