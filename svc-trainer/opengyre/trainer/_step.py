"""One optimizer step: micro-batches in, accumulated gradients, clipped update out.

The step does not know the algorithm: it computes logprobs through the backend, hands ``LossInputs`` to
whatever ``Algorithm`` it holds, and backpropagates the returned loss. Weights stay fixed while gradients
accumulate, so the clipping anchor ``old_logprobs`` is the current logprobs, detached (one update per batch).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ._packing import MicroBatch
from .algorithms import Algorithm, LossInputs, LossOutput
from .backends import Backend

__all__ = ["DataParallel", "Learner", "MicroResult", "StepResult", "accumulate"]


@dataclass
class MicroResult:
    loss: float
    n_samples: int  # samples, whatever the layout (a packed row holds several)
    n_targets: int
    n_tokens: int
    padded_tokens: int
    metrics: dict[str, float]


@dataclass
class StepResult:
    loss: float = 0.0
    grad_norm: float = 0.0
    micro_steps: int = 0
    n_samples: int = 0
    n_targets: int = 0
    n_tokens: int = 0
    padded_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    def add(self, r: MicroResult) -> None:
        self.loss += r.loss
        self.micro_steps += 1
        self.n_samples += r.n_samples
        self.n_targets += r.n_targets
        self.n_tokens += r.n_tokens
        self.padded_tokens += r.padded_tokens
        for k, v in r.metrics.items():
            # Metrics are averaged over micro-steps, weighted by their targets.
            self.metrics[k] = self.metrics.get(k, 0.0) + v * r.n_targets

    def finish(self) -> None:
        n = max(self.n_targets, 1)
        self.metrics = {k: v / n for k, v in self.metrics.items()}


def accumulate(backend: Backend, algorithm: Algorithm, mb: MicroBatch, reference: Backend | None = None) -> MicroResult:
    """Forward, loss and backward of one micro-batch on ``backend``; its gradients accumulate."""
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = reference.token_logprobs(mb)

    def loss_fn(logprobs: torch.Tensor) -> LossOutput:
        return algorithm.loss(
            LossInputs(
                logprobs=logprobs,
                old_logprobs=logprobs.detach(),
                behaviour_logprobs=mb.behaviour_logprobs,
                advantages=mb.advantages,
                mask=mb.mask,
                token_weights=mb.token_weights,
                ref_logprobs=ref,
                segments=mb.target_segments() if mb.position_ids is not None else None,
            )
        )

    out = backend.forward_backward(mb, loss_fn)
    return MicroResult(
        float(out.loss.detach()), len(mb.execution_ids), mb.n_targets, mb.n_tokens, mb.padded_tokens, out.metrics
    )


class Learner:
    """A backend, an algorithm and an optimizer; ``step`` runs one update over a stream of micro-batches."""

    def __init__(
        self,
        backend: Backend,
        algorithm: Algorithm,
        *,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        reference: Backend | None = None,
        data_parallel: DataParallel | None = None,
    ) -> None:
        self.backend = backend
        self.algorithm = algorithm
        self.max_grad_norm = max_grad_norm
        self.reference = reference
        self.dp = data_parallel or DataParallel()
        self.optimizer = torch.optim.AdamW(backend.parameters(), lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))

    def accumulate(self, mb: MicroBatch) -> MicroResult:
        """Forward, loss, backward for one micro-batch; gradients add up until ``apply``."""
        return accumulate(self.backend, self.algorithm, mb, self.reference)

    def grad_norm(self) -> float:
        return self.backend.grad_norm()

    def apply(self) -> float:
        """Clip, update, clear; returns the pre-clip gradient norm.

        A non-finite norm (an overflow, a NaN logprob) skips the update: one bad batch must not poison the
        weights and, through them, every later rollout. The caller sees the norm and can count the skip.
        """
        norm = self.grad_norm()
        if not math.isfinite(norm):
            self.backend.zero_grad()
            return norm
        if self.max_grad_norm is not None and norm > self.max_grad_norm:
            scale = self.max_grad_norm / (norm + 1e-6)
            for p in self.backend.parameters():
                if p.grad is not None:
                    p.grad.mul_(scale)
        self.optimizer.step()
        self.backend.zero_grad()
        return norm

    def step(self, microbatches: Iterable[MicroBatch]) -> StepResult:
        self.backend.zero_grad()
        result = StepResult()
        if self.dp.size > 1:
            # Every replica gets the whole list and takes its share; the gradients are summed before the update.
            microbatches = list(microbatches)[self.dp.rank :: self.dp.size]
        for mb in microbatches:  # an iterator is fine: micro-steps are consumed as they become ready
            result.add(self.accumulate(mb))
        if self.dp.size > 1:
            self.dp.reduce(self.backend, result)
        result.grad_norm = self.apply()
        result.finish()
        return result


@dataclass
class DataParallel:
    """Replicas of the model (each possibly TP/PP-sharded) that split a step's micro-batches between them.

    Token weights are normalised over the whole step, so the replicas' gradients simply add up (all-reduce
    sum over ``group``), as do their losses and counts; every replica then applies the same update.
    """

    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed process group (None: the default group)

    def reduce(self, backend: Backend, result: StepResult) -> None:
        import torch.distributed as dist

        for p in backend.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.group)
        mine = (result.loss, result.micro_steps, result.n_samples, result.n_targets, result.n_tokens,
                result.padded_tokens, result.metrics)  # fmt: skip
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, mine, group=self.group)  # a replica may have had no micro-batch at all
        result.loss = sum(p[0] for p in parts)
        result.micro_steps, result.n_samples = sum(p[1] for p in parts), sum(p[2] for p in parts)
        result.n_targets, result.n_tokens = sum(p[3] for p in parts), sum(p[4] for p in parts)
        result.padded_tokens = sum(p[5] for p in parts)
        merged: dict[str, float] = {}
        for p in parts:
            for k, v in p[6].items():  # target-weighted sums until ``finish``: they add up too
                merged[k] = merged.get(k, 0.0) + v
        result.metrics = merged
