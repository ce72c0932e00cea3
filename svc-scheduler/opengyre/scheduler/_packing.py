"""The packing buffer of streaming training: complete groups become micro-steps, training cells claim them one
at a time (a claim is atomic: one owner per micro-step), a faster cell simply comes back for more, and the
step completes when its last micro-step does. A cell that leaves training mid-micro-step releases it."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from ._policy import LoopConfig, Packing
from ._state import SchedulerState

__all__ = ["MicroStep", "PackingBuffer"]


@dataclass(frozen=True, slots=True)
class MicroStep:
    step: int
    index: int
    group_ids: tuple[str, ...]
    part: int = 0  # which of ``parts`` slices of the groups' samples this micro-step trains
    parts: int = 1

    def select(self, execution_ids: Sequence[str]) -> tuple[str, ...]:
        """This part's contiguous slice of the groups' executions (all of them when ``parts`` is 1)."""
        n = len(execution_ids)
        return tuple(execution_ids[n * self.part // self.parts : n * (self.part + 1) // self.parts])


@dataclass
class PackingBuffer:
    loop: LoopConfig
    packing: Packing = "batch"
    streaming: bool = True
    # Groups staler than this at the step being packed are never trained (None: no cap). Their samples stay
    # in the ready buffer, unconsumed, and are reported as dropped.
    staleness_cap: int | None = None
    step: int = 1
    _assigned: list[str] = field(default_factory=list)
    _assigned_set: set[str] = field(default_factory=set)
    _pending: list[str] = field(default_factory=list)  # assigned groups not yet cut into a micro-step
    _queue: deque[MicroStep] = field(default_factory=deque)
    _claimed: dict[int, str] = field(default_factory=dict)  # micro-step index -> cell
    _done: int = 0
    _cut: int = 0
    _seen_rev: int = -1

    def sync(self, state: SchedulerState) -> None:
        """Follow the state: a new step after a training step completed, and newly complete groups."""
        if state.trained_step + 1 != self.step:
            self._reset(state.trained_step + 1)
        if state.ready_rev == self._seen_rev:
            return
        self._seen_rev = state.ready_rev
        want = self.loop.groups_per_step
        for g in state.ready_groups():
            if len(self._assigned) >= want:
                break
            if g.group_id in self._assigned_set or (self.packing == "batch" and g.step != self.step):
                continue
            if self.staleness_cap is not None and self.step - 1 - g.version_step > self.staleness_cap:
                continue
            self._assigned.append(g.group_id)
            self._assigned_set.add(g.group_id)
            self._pending.append(g.group_id)
        whole = len(self._assigned) >= want
        if not self.streaming and not whole:
            return  # a non-streaming trainer starts only on a whole batch
        mg, parts = self.loop.micro_groups, self.loop.micro_splits
        while len(self._pending) >= mg or (whole and self._pending):
            chunk, self._pending = self._pending[:mg], self._pending[mg:]
            for part in range(parts):
                self._queue.append(MicroStep(self.step, self._cut, tuple(chunk), part, parts))
                self._cut += 1

    def _reset(self, step: int) -> None:
        self.step = step
        self._assigned, self._assigned_set, self._pending = [], set(), []
        self._queue.clear()
        self._claimed.clear()
        self._done = self._cut = 0
        self._seen_rev = -1

    @property
    def available(self) -> int:
        return len(self._queue)

    @property
    def in_progress(self) -> int:
        return len(self._claimed)

    def claim(self, cell_id: str) -> MicroStep | None:
        if not self._queue:
            return None
        m = self._queue.popleft()
        self._claimed[m.index] = cell_id
        return m

    def release(self, m: MicroStep) -> None:
        """The claimant left before finishing: the micro-step goes back to the front of the line."""
        if m.step == self.step and self._claimed.pop(m.index, None) is not None:
            self._queue.appendleft(m)

    def complete(self, m: MicroStep) -> bool:
        """Record a finished micro-step; True when it was the step's last one."""
        if m.step != self.step or self._claimed.pop(m.index, None) is None:
            return False
        self._done += 1
        return self.is_complete

    @property
    def is_complete(self) -> bool:
        return (
            len(self._assigned) >= self.loop.groups_per_step
            and not self._pending
            and not self._queue
            and not self._claimed
            and self._done == self._cut
        )

    def groups(self) -> list[str]:
        return list(self._assigned)
