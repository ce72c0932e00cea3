"""Token-level clipped policy gradient (GRPO; DAPO's decoupled "clip-higher" bounds).

Per target token: ``-min(r * A, clip(r, 1 - eps_low, 1 + eps_high) * A)`` with ``r = pi / pi_old``, times the
truncated importance weight against the behaviour policy, plus ``beta * KL`` when a reference is given.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput, masked_sum
from ._importance import token_tis
from ._kl import k3

__all__ = ["GRPO"]


@dataclass
class GRPO(Algorithm):
    name: ClassVar[str] = "grpo"
    eps_low: float = 0.2
    eps_high: float = 0.28  # DAPO clip-higher; set equal to eps_low for symmetric PPO clipping
    tis_cap: float | None = 2.0
    kl_beta: float = 0.0

    def loss(self, x: LossInputs) -> LossOutput:
        zero = torch.zeros_like(x.logprobs)
        log_ratio = torch.where(x.mask, x.logprobs - x.old_logprobs, zero)
        ratio = torch.exp(log_ratio)
        adv = x.token_advantages()
        unclipped = ratio * adv
        clipped = ratio.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * adv
        per_token = -torch.minimum(unclipped, clipped)
        tis = token_tis(x.old_logprobs, x.behaviour_logprobs, x.mask, self.tis_cap)
        per_token = per_token * tis
        kl_value = 0.0
        if self.kl_beta and x.ref_logprobs is not None:
            kl = k3(x.logprobs, x.ref_logprobs, x.mask)
            per_token = per_token + self.kl_beta * kl
            kl_value = float(masked_sum(kl.detach(), x.token_weights))
        loss = masked_sum(per_token, x.token_weights)
        with torch.no_grad():
            m = x.mask
            n = max(int(m.sum()), 1)
            clip_frac = float(((clipped < unclipped) & m).sum()) / n  # the clipped term won the min
            metrics = {
                "clip_fraction": clip_frac,
                "ratio_mean": float(torch.where(m, ratio, zero).sum()) / n,
                "tis_mean": float(torch.where(m, tis, zero).sum()) / n,
                "kl": kl_value,
            }
        return LossOutput(loss=loss, metrics=metrics)
