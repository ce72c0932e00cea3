"""Streaming training: micro-steps are consumed as data becomes ready, by the core and by satellites.

The packing buffer hands out micro-batches one at a time; every worker claims atomically and works at its
own pace (fast ones do more), so all finish close together. A satellite joins a running step with a
snapshot of the core's weights; the weights are fixed while gradients accumulate, so the snapshot is exact
and the satellites' gradients simply add to the core's before the single optimizer update.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ._packing import MicroBatch
from ._step import Learner, MicroResult, StepResult, accumulate
from .algorithms import Algorithm
from .backends import Backend

__all__ = ["MicroStepBuffer", "Satellite", "snapshot_digest", "streaming_step"]


class MicroStepBuffer:
    """A thread-safe FIFO of micro-batches with atomic claims; ``close`` says no more will come."""

    def __init__(self) -> None:
        self._items: deque[MicroBatch] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self.claims: dict[str, int] = {}
        self.produced = 0

    def put(self, mb: MicroBatch) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the buffer is closed")
            self._items.append(mb)
            self.produced += 1
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()

    def claim(self, worker: str) -> MicroBatch | None:
        """The next micro-batch, waiting for one; None once the buffer is closed and drained."""
        with self._cv:
            while not self._items and not self._closed:
                self._cv.wait()
            if not self._items:
                return None
            self.claims[worker] = self.claims.get(worker, 0) + 1
            return self._items.popleft()


def snapshot_digest(state: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


@dataclass
class Satellite:
    """A worker cell with its own backend (any backend: weights travel in Hugging Face naming)."""

    name: str
    backend: Backend
    algorithm: Algorithm
    reference: Backend | None = None  # the frozen reference policy, when the algorithm has a KL term
    joined_digest: str = ""
    results: list[MicroResult] = field(default_factory=list)
    rows: int = 0

    def join(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        self.backend.load_hf_state_dict(snapshot)
        self.backend.zero_grad()
        self.joined_digest = snapshot_digest(self.backend.hf_state_dict())
        self.results = []
        self.rows = 0

    def work(self, buffer: MicroStepBuffer) -> None:
        # No optimizer of its own: the core applies the one update with everyone's gradients.
        while (mb := buffer.claim(self.name)) is not None:
            self.results.append(accumulate(self.backend, self.algorithm, mb, self.reference))
            self.rows += int(mb.input_ids.shape[0])


def streaming_step(
    core: Learner, buffer: MicroStepBuffer, satellites: Sequence[Satellite] = (), *, core_name: str = "core"
) -> StepResult:
    """One update from everything put into ``buffer`` until it is closed (by the producer, on any thread)."""
    snapshot = core.backend.hf_state_dict()
    digest = snapshot_digest(snapshot)
    core.backend.zero_grad()
    errors: list[BaseException] = []

    def run(sat: Satellite) -> None:
        try:
            sat.join(snapshot)
            sat.work(buffer)
        except BaseException as exc:  # surfaced below: a failed satellite must fail the step
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(s,), name=f"satellite-{s.name}") for s in satellites]
    for t in threads:
        t.start()
    result = StepResult()
    while (mb := buffer.claim(core_name)) is not None:
        result.add(core.accumulate(mb), int(mb.input_ids.shape[0]))
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"a satellite failed: {errors[0]!r}") from errors[0]
    for s in satellites:
        if s.joined_digest != digest:
            raise RuntimeError(f"satellite {s.name} joined with different weights")
        if s.results:
            core.backend.add_hf_grads(s.backend.hf_grads())
        for r in s.results:
            result.add(r, 0)
        result.n_samples += s.rows
    result.grad_norm = core.apply()
    result.finish()
    return result
