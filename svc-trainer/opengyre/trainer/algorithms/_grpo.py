"""Token-level clipped policy gradient: vanilla GRPO (symmetric clip, 0.2 / 0.2) and DAPO (clip-higher).

Per target token: ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = pi / pi_old`` (``pi_old``:
the step-start, proximal policy), times the truncated importance weight ``min(pi_old / pi_behaviour, C)``
against the behaviour policy, plus ``beta * KL`` when a reference is given. Tokens whose behaviour ratio is
outside ``[mis_low, mis_high]`` are masked (IcePop / MIS); both bounds are off by default.

``DAPO`` is the same loss with DAPO's decoupled bounds (0.2 / 0.28) and DAPO's recipe: token-level loss
aggregation and dynamic sampling, which the trainer's config takes from the algorithm (``loss_aggregation`` and
``dynamic_sampling`` unset) and refuses to contradict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput, masked_sum
from ._importance import behaviour_ratio, mis_keep, validate_bounds
from ._kl import k3

__all__ = ["DAPO", "GRPO"]


@dataclass
class GRPO(Algorithm):
    name: ClassVar[str] = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.2  # symmetric, as GRPO / PPO (verl's clip_ratio_low = clip_ratio_high = 0.2)
    tis_cap: float | None = 2.0
    kl_beta: float = 0.0
    mis_low: float | None = None
    mis_high: float | None = None

    def __post_init__(self) -> None:
        if not (0.0 < self.eps_low < 1.0 and self.eps_high > 0.0):
            raise ValueError(f"need 0 < eps_low < 1 and eps_high > 0, got {self.eps_low}, {self.eps_high}")
        if self.kl_beta < 0:
            raise ValueError("kl_beta must be >= 0")
        validate_bounds(self.tis_cap, self.mis_low, self.mis_high)

    @property
    def needs_reference(self) -> bool:
        return self.kl_beta > 0

    def loss(self, x: LossInputs) -> LossOutput:
        zero = torch.zeros_like(x.logprobs)
        w = behaviour_ratio(x.old_logprobs, x.behaviour_logprobs, x.mask)
        keep = x.mask & mis_keep(w, self.mis_low, self.mis_high)
        log_ratio = torch.where(keep, x.logprobs - x.old_logprobs, zero)
        ratio = torch.exp(log_ratio)
        adv = x.token_advantages()
        unclipped = ratio * adv
        clipped = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * adv
        per_token = -torch.minimum(unclipped, clipped)
        tis = w.clamp(max=self.tis_cap) if self.tis_cap is not None else torch.ones_like(w)
        per_token = per_token * tis
        kl_value = 0.0
        weights = torch.where(keep, x.token_weights, zero)
        if self.kl_beta and x.ref_logprobs is not None:
            kl = k3(x.logprobs, x.ref_logprobs, keep)
            per_token = per_token + self.kl_beta * kl
            kl_value = float(masked_sum(kl.detach(), weights))
        loss = masked_sum(per_token, weights)
        with torch.no_grad():
            m = x.mask
            n = max(int(m.sum()), 1)
            metrics = {
                "clip_fraction": float(((clipped < unclipped) & keep).sum()) / n,  # the clipped term won the min
                "ratio_mean": float(torch.where(keep, ratio, zero).sum()) / n,
                "tis_mean": float(torch.where(keep, tis, zero).sum()) / n,
                "tis_clip_fraction": float(((w > self.tis_cap) & keep).sum()) / n if self.tis_cap else 0.0,
                "mis_masked_fraction": float((m & ~keep).sum()) / n,
                "kl": kl_value,
            }
        return LossOutput(loss=loss, metrics=metrics)


@dataclass
class DAPO(GRPO):
    """DAPO (Yu et al., 2025): clip-higher (``eps_high`` 0.28 > ``eps_low`` 0.2), token-level loss, dynamic
    sampling (verl's DAPO recipe: clip_ratio_high 0.28, loss_agg_mode token-mean, filter_groups)."""

    name: ClassVar[str] = "dapo"
    loss_aggregation: ClassVar[str | None] = "token-mean"
    dynamic_sampling: ClassVar[bool | None] = True
    eps_high: float = 0.28
