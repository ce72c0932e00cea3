"""Streaming training: micro-steps are consumed as data becomes ready, by the core and by satellites.

The packing buffer hands out micro-batches one at a time; every worker claims atomically and works at its
own pace (fast ones do more), so all finish close together. A satellite joins a running step with a
snapshot of the core's weights; the weights are fixed while gradients accumulate, so the snapshot is exact
and the satellites' gradients simply add to the core's before the step's first update. Each worker computes
the proximal (step-start) logprobs of what it claims before its backward pass: the weights still are the
step-start ones. The producer closes the buffer with the loss normaliser of everything it put in (the same
rule as a batch step, known only once the last group is in): the gradients are divided by it before the
update, so a streamed step and a batch step over the same data give the same gradient. Further PPO epochs
replay the stored micro-batches on the core with their proximal logprobs.
"""

from __future__ import annotations

import hashlib
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ._packing import MicroBatch
from ._step import Learner, MicroResult, Proximal, StepResult, accumulate, proximal
from .algorithms import Algorithm
from .backends import Backend

__all__ = [
    "Cell",
    "MicroStepBuffer",
    "Satellite",
    "StepFinished",
    "StreamingStep",
    "snapshot_digest",
    "streaming_step",
]


class StepFinished(RuntimeError):
    """A satellite came too late: the step no longer takes anyone (it joins the next one)."""


class MicroStepBuffer:
    """A thread-safe FIFO of micro-batches with atomic claims; ``close`` says no more will come."""

    def __init__(self) -> None:
        self._items: deque[MicroBatch] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self.claims: dict[str, int] = {}
        self.produced = 0
        self.normaliser = 1.0  # what the summed loss of everything put in is divided by (set by ``close``)

    def put(self, mb: MicroBatch) -> None:
        with self._cv:
            if self._closed:
                raise RuntimeError("the buffer is closed")
            self._items.append(mb)
            self.produced += 1
            self._cv.notify()

    def close(self, normaliser: float = 1.0) -> None:
        """No more micro-batches; ``normaliser`` is the step's loss normaliser over all of them."""
        if not (normaliser > 0 and normaliser < float("inf")):
            raise ValueError(f"a loss normaliser must be a positive number, got {normaliser}")
        with self._cv:
            self.normaliser = normaliser
            self._closed = True
            self._cv.notify_all()

    def claim(self, worker: str, stop: threading.Event | None = None) -> MicroBatch | None:
        """The next micro-batch, waiting for one; None once the buffer is closed and drained, or once ``stop``
        is set (a cell leaving between micro-steps: ``wake`` ends the wait of one already waiting)."""
        with self._cv:
            while not self._items and not self._closed and not (stop is not None and stop.is_set()):
                self._cv.wait()
            if not self._items or (stop is not None and stop.is_set()):
                return None
            self.claims[worker] = self.claims.get(worker, 0) + 1
            return self._items.popleft()

    def wake(self) -> None:
        """Have every waiting claimer look at its ``stop`` again."""
        with self._cv:
            self._cv.notify_all()


def snapshot_digest(state: Mapping[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


class Cell(Protocol):
    """A satellite as a step sees it: in this process (``Satellite``) or in its own (``ProcessSatellite``)."""

    name: str
    joined_digest: str
    results: list[tuple[MicroBatch, Proximal, MicroResult]]

    def join(self, snapshot: Mapping[str, torch.Tensor]) -> None: ...
    def work(self, buffer: MicroStepBuffer) -> None: ...
    def leave(self) -> None: ...
    def grads(self) -> Mapping[str, torch.Tensor]: ...
    def close(self) -> None: ...


@dataclass
class Satellite:
    """A worker cell in this process with its own backend (any backend: weights travel in Hugging Face naming)."""

    name: str
    backend: Backend
    algorithm: Algorithm
    reference: Backend | None = None  # the frozen reference policy, when the algorithm has a KL term
    joined_digest: str = ""
    results: list[tuple[MicroBatch, Proximal, MicroResult]] = field(default_factory=list)

    _leave: threading.Event = field(default_factory=threading.Event, repr=False)
    _buffer: MicroStepBuffer | None = field(default=None, repr=False)

    def join(self, snapshot: Mapping[str, torch.Tensor]) -> None:
        self.backend.load_hf_state_dict(snapshot)
        self.backend.zero_grad()
        self.joined_digest = snapshot_digest(self.backend.hf_state_dict())
        self.results = []

    def work(self, buffer: MicroStepBuffer) -> None:
        # No optimizer of its own: the core applies the update with everyone's gradients.
        self._buffer = buffer
        while (mb := buffer.claim(self.name, self._leave)) is not None:
            prox = proximal(self.backend, mb)
            self.results.append((mb, prox, accumulate(self.backend, self.algorithm, mb, prox, self.reference)))
        self._leave.clear()  # the next step it joins, it works in again

    def leave(self) -> None:
        """Take no more micro-batches in this step (the one in hand is finished; its gradients still count)."""
        self._leave.set()
        if self._buffer is not None:
            self._buffer.wake()

    def grads(self) -> Mapping[str, torch.Tensor]:
        return self.backend.hf_grads()

    def close(self) -> None:
        """Nothing to release: the backend is this process's."""


class StreamingStep:
    """One optimizer step fed by a buffer, which satellites may join at any time before it finishes.

    ``start`` snapshots the core's weights (fixed until ``finish``); ``join`` starts a satellite on that
    snapshot, even while the core is already working through micro-batches; ``finish`` (on the thread that
    runs the core) consumes the buffer until it is closed and drained, waits for the satellites, adds their
    gradients and applies the single update.
    """

    def __init__(self, core: Learner, buffer: MicroStepBuffer, *, core_name: str = "core", epochs: int = 1) -> None:
        if epochs < 1:
            raise ValueError("epochs must be >= 1")
        self.core = core
        self.buffer = buffer
        self.core_name = core_name
        self.epochs = epochs
        self.snapshot = core.backend.hf_state_dict()
        self.digest = snapshot_digest(self.snapshot)
        core.backend.zero_grad()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._satellites: list[Cell] = []
        self._errors: list[BaseException] = []
        self._finished = False

    def join(self, sat: Cell) -> None:
        """Bring a satellite into the running step (it claims micro-batches as soon as it has the weights)."""

        def run() -> None:
            try:
                sat.join(self.snapshot)
                sat.work(self.buffer)
            except BaseException as exc:  # surfaced by finish: a failed satellite must fail the step
                self._errors.append(exc)

        with self._lock:
            if self._finished:
                raise StepFinished("the step has finished: nothing left to join")
            t = threading.Thread(target=run, name=f"satellite-{sat.name}")
            self._satellites.append(sat)
            self._threads.append(t)
            t.start()

    def finish(self) -> StepResult:
        result = StepResult()
        done: list[tuple[MicroBatch, Proximal]] = []
        loss = 0.0
        while (mb := self.buffer.claim(self.core_name)) is not None:
            prox = self.core.proximal(mb)
            r = self.core.accumulate(mb, prox)
            result.add_proximal(prox)
            result.add(r)
            loss += r.loss
            done.append((mb, prox))
        with self._lock:
            self._finished = True
            threads, satellites = list(self._threads), list(self._satellites)
        for t in threads:
            t.join()
        if self._errors:
            raise RuntimeError(f"a satellite failed: {self._errors[0]!r}") from self._errors[0]
        for sat in satellites:
            if sat.joined_digest != self.digest:
                raise RuntimeError(f"satellite {sat.name} joined with different weights")
            if sat.results:
                self.core.backend.add_hf_grads(sat.grads())
            for mb, prox, r in sat.results:
                result.add_proximal(prox)
                result.add(r)
                loss += r.loss
                done.append((mb, prox))
        normaliser = self.buffer.normaliser
        result.loss = loss / normaliser
        result.note_update(self.core.apply(normaliser))
        for _ in range(1, self.epochs):  # later epochs: the core alone, anchored at the step-start logprobs
            loss = 0.0
            for mb, prox in done:
                r = self.core.accumulate(mb, prox)
                result.add(r, first_epoch=False)
                loss += r.loss
            result.loss += loss / normaliser
            result.note_update(self.core.apply(normaliser))
        result.finish(self.epochs)
        return result


def streaming_step(
    core: Learner,
    buffer: MicroStepBuffer,
    satellites: Sequence[Cell] = (),
    *,
    core_name: str = "core",
    epochs: int = 1,
) -> StepResult:
    """One step from everything put into ``buffer`` until it is closed (by the producer, on any thread), with
    ``satellites`` joining from the start; ``epochs`` updates over the same micro-batches."""
    step = StreamingStep(core, buffer, core_name=core_name, epochs=epochs)
    for sat in satellites:
        step.join(sat)
    return step.finish()
