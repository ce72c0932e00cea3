"""One training step: proximal logprobs, then mini-batch updates over one or more PPO epochs.

Decoupled PPO (AReaL; verl and slime recompute ``old_log_prob`` the same way): at the start of the step the
trainer recomputes the *proximal* logprobs of every target with the step-start weights (no gradient). Every
update then clips ``pi / pi_prox``, and the behaviour logprobs the engine recorded only enter the importance
correction ``pi_prox / pi_behaviour``. The step's data is split into mini-batches (whole executions each) and
every mini-batch is one optimizer update, ``epochs`` times over: from the second update on the policy has
moved, the ratio leaves 1 and the clip acts.

Weights are fixed while a mini-batch's gradients accumulate, so its micro-batches (and satellites, and
data-parallel replicas) simply add up; the sum is divided by the mini-batch's ``normaliser`` (see
``_samples.loss_normaliser``: the one weighting rule batch and streaming steps share) before the update.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ._packing import MicroBatch
from .algorithms import Algorithm, LossInputs, LossOutput, mismatch_metrics
from .backends import Backend

__all__ = ["DataParallel", "Learner", "MicroResult", "MiniBatch", "Proximal", "StepResult", "accumulate", "proximal"]


@dataclass
class MiniBatch:
    """The micro-batches of one optimizer update, and what their summed loss is divided by."""

    micro_batches: list[MicroBatch]
    normaliser: float = 1.0

    def __post_init__(self) -> None:
        if not (self.normaliser > 0 and math.isfinite(self.normaliser)):
            raise ValueError(f"a mini-batch normaliser must be a positive number, got {self.normaliser}")


@dataclass
class Proximal:
    """The step-start policy on one micro-batch: its logprobs (None on a pipeline stage that has no logits)
    and what it says about the engine-trainer mismatch."""

    logprobs: torch.Tensor | None
    metrics: dict[str, float]
    n_targets: int


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
    loss: float = 0.0  # the mean over the step's updates of each update's (normalised) loss
    grad_norm: float = 0.0  # the largest pre-clip gradient norm of the step's updates (nan if one was not finite)
    micro_steps: int = 0
    updates: int = 0  # optimizer updates applied
    skipped_updates: int = 0  # updates whose gradient norm was not finite (the weights were left as they were)
    n_samples: int = 0  # the step's data, counted once (not once per epoch)
    n_targets: int = 0
    n_tokens: int = 0
    padded_tokens: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    proximal: dict[str, float] = field(default_factory=dict)  # mismatch metrics at the step start
    _weight: dict[str, float] = field(default_factory=dict)  # target counts behind each metric's running sum

    def add(self, r: MicroResult, *, first_epoch: bool = True) -> None:
        """Counts and metrics of one micro-step (the loss is the caller's: it knows the update's normaliser)."""
        self.micro_steps += 1
        if first_epoch:
            self.n_samples += r.n_samples
            self.n_targets += r.n_targets
            self.n_tokens += r.n_tokens
            self.padded_tokens += r.padded_tokens
        for k, v in r.metrics.items():
            # Metrics are averaged over micro-steps (every epoch), weighted by their targets.
            self.metrics[k] = self.metrics.get(k, 0.0) + v * r.n_targets
            self._weight[k] = self._weight.get(k, 0.0) + r.n_targets

    def add_proximal(self, p: Proximal) -> None:
        for k, v in p.metrics.items():
            self.proximal[k] = self.proximal.get(k, 0.0) + v * p.n_targets
            self._weight["proximal:" + k] = self._weight.get("proximal:" + k, 0.0) + p.n_targets

    def note_update(self, norm: float) -> None:
        if math.isfinite(norm):
            self.updates += 1
        else:
            self.skipped_updates += 1
        if not math.isfinite(norm) or not math.isfinite(self.grad_norm):
            self.grad_norm = float("nan")
        else:
            self.grad_norm = max(self.grad_norm, norm)

    def finish(self, n_updates: int) -> None:
        self.loss = self.loss / max(n_updates, 1)
        self.metrics = {k: v / max(self._weight.get(k, 0.0), 1.0) for k, v in self.metrics.items()}
        self.proximal = {k: v / max(self._weight.get("proximal:" + k, 0.0), 1.0) for k, v in self.proximal.items()}
        self.metrics.update(self.proximal)


def proximal(backend: Backend, mb: MicroBatch) -> Proximal:
    """The step-start logprobs of ``mb`` (no gradient) and the engine-trainer mismatch they show."""
    stats = backend.forward_stats(mb)
    if stats is None:  # a pipeline stage without the logits: the last stage has them and computes the loss
        return Proximal(None, {}, mb.n_targets)
    metrics = mismatch_metrics(stats.logprobs, mb.behaviour_logprobs, mb.mask)
    n = max(mb.n_targets, 1)
    metrics["entropy"] = float(torch.where(mb.mask, stats.entropy, torch.zeros_like(stats.entropy)).sum()) / n
    return Proximal(stats.logprobs, metrics, mb.n_targets)


def accumulate(
    backend: Backend,
    algorithm: Algorithm,
    mb: MicroBatch,
    prox: Proximal | None = None,
    reference: Backend | None = None,
) -> MicroResult:
    """Forward, loss and backward of one micro-batch on ``backend``; its gradients accumulate.

    ``prox``: the step-start logprobs (the clipping anchor). Without them the current logprobs, detached, are
    the anchor: right only while the weights still are the step-start ones."""
    ref = None
    if reference is not None:
        with torch.no_grad():
            ref = reference.token_logprobs(mb)

    def loss_fn(logprobs: torch.Tensor) -> LossOutput:
        old = prox.logprobs if prox is not None and prox.logprobs is not None else logprobs.detach()
        return algorithm.loss(
            LossInputs(
                logprobs=logprobs,
                old_logprobs=old,
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


def as_minibatches(data: Sequence[MiniBatch] | Iterable[MicroBatch]) -> list[MiniBatch]:
    """A flat list of micro-batches is one mini-batch whose weights are already normalised (SFT, tests)."""
    items = list(data)
    if items and all(isinstance(x, MiniBatch) for x in items):
        return [x for x in items if isinstance(x, MiniBatch)]
    return [MiniBatch([x for x in items if isinstance(x, MicroBatch)], 1.0)]


class Learner:
    """A backend, an algorithm and an optimizer; ``step`` runs one training step (one or more updates)."""

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

    def set_lr(self, lr: float) -> None:
        for g in self.optimizer.param_groups:
            g["lr"] = lr

    def proximal(self, mb: MicroBatch) -> Proximal:
        return proximal(self.backend, mb)

    def accumulate(self, mb: MicroBatch, prox: Proximal | None = None) -> MicroResult:
        """Forward, loss, backward for one micro-batch; gradients add up until ``apply``."""
        return accumulate(self.backend, self.algorithm, mb, prox, self.reference)

    def grad_norm(self) -> float:
        return self.backend.grad_norm()

    def apply(self, normaliser: float = 1.0) -> float:
        """Divide the accumulated gradients by ``normaliser``, clip, update, clear; returns the pre-clip norm.

        A non-finite norm (an overflow, a NaN logprob) skips the update: one bad batch must not poison the
        weights and, through them, every later rollout. The caller sees the norm and can count the skip.
        """
        if normaliser != 1.0:
            for p in self.backend.parameters():
                if p.grad is not None:
                    p.grad.div_(normaliser)
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

    def step(self, data: Sequence[MiniBatch] | Iterable[MicroBatch], epochs: int = 1) -> StepResult:
        """One training step: ``epochs`` passes over the mini-batches, one update per mini-batch. The step-start
        (proximal) logprobs of every micro-batch are computed before the first update."""
        if epochs < 1:
            raise ValueError("epochs must be >= 1")
        minibatches = as_minibatches(data)
        self.backend.zero_grad()
        result = StepResult()
        # Every replica gets the whole plan and takes its share of each mini-batch's micro-batches.
        mine = [mb.micro_batches[self.dp.rank :: self.dp.size] for mb in minibatches]
        prox: dict[int, Proximal] = {}
        for part in mine:
            for mb in part:
                p = self.proximal(mb)
                prox[id(mb)] = p
                result.add_proximal(p)
        n_updates = 0
        for epoch in range(epochs):
            for k, part in enumerate(mine):
                update_loss = 0.0
                for mb in part:
                    r = self.accumulate(mb, prox[id(mb)])
                    update_loss += r.loss
                    result.add(r, first_epoch=epoch == 0)
                result.loss += update_loss / minibatches[k].normaliser
                if self.dp.size > 1:
                    self.dp.reduce_grads(self.backend)
                result.note_update(self.apply(minibatches[k].normaliser))
                n_updates += 1
        if self.dp.size > 1:
            self.dp.reduce(result)
        result.finish(n_updates)
        return result


@dataclass
class DataParallel:
    """Replicas of the model (each possibly TP/PP-sharded) that split each mini-batch's micro-batches.

    The replicas' gradients add up (all-reduce sum over ``group``) before every update, as do their losses and
    counts at the end of the step; every replica then applies the same updates.
    """

    rank: int = 0
    size: int = 1
    group: Any = None  # a torch.distributed process group (None: the default group)

    def reduce_grads(self, backend: Backend) -> None:
        import torch.distributed as dist

        for p in backend.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad, group=self.group)

    def reduce(self, result: StepResult) -> None:
        import torch.distributed as dist

        mine = (result.loss, result.micro_steps, result.n_samples, result.n_targets, result.n_tokens,
                result.padded_tokens, result.metrics, result.proximal, result._weight)  # fmt: skip
        parts: list[Any] = [None] * self.size
        dist.all_gather_object(parts, mine, group=self.group)  # a replica may have had no micro-batch at all
        result.loss = sum(p[0] for p in parts)
        result.micro_steps, result.n_samples = sum(p[1] for p in parts), sum(p[2] for p in parts)
        result.n_targets, result.n_tokens = sum(p[3] for p in parts), sum(p[4] for p in parts)
        result.padded_tokens = sum(p[5] for p in parts)
        for i, name in ((6, "metrics"), (7, "proximal"), (8, "_weight")):
            merged: dict[str, float] = {}
            for p in parts:
                for k, v in p[i].items():  # target-weighted sums until ``finish``: they add up too
                    merged[k] = merged.get(k, 0.0) + v
            setattr(result, name, merged)
