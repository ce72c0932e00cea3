"""GSPO: a sequence-level importance ratio, clipped per sequence.

``s = exp(mean_t(log pi - log pi_old))`` over the sequence's targets; the sequence's loss is
``-min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A)``, weighted by the sequence's share of the step (the sum
of its token weights, so within-execution averaging holds here too). Clipping bounds are much tighter than
token-level ones because a length-normalised ratio moves little.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput
from ._importance import sequence_tis
from ._kl import k3

__all__ = ["GSPO"]


@dataclass
class GSPO(Algorithm):
    name: ClassVar[str] = "gspo"
    eps_low: float = 3e-4
    eps_high: float = 4e-4
    tis_cap: float | None = 2.0
    kl_beta: float = 0.0

    def loss(self, x: LossInputs) -> LossOutput:
        zero = torch.zeros_like(x.logprobs)
        m = x.mask.to(x.logprobs.dtype)
        n = m.sum(-1).clamp(min=1.0)
        seq_log_ratio = (torch.where(x.mask, x.logprobs - x.old_logprobs, zero) * m).sum(-1) / n
        s = torch.exp(seq_log_ratio)
        adv = x.advantages.to(x.logprobs.dtype)
        unclipped = s * adv
        clipped = s.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * adv
        per_seq = -torch.minimum(unclipped, clipped) * sequence_tis(
            x.old_logprobs, x.behaviour_logprobs, x.mask, self.tis_cap
        )
        seq_weight = torch.where(x.mask, x.token_weights, zero).sum(-1)
        loss = (per_seq * seq_weight).sum()
        kl_value = 0.0
        if self.kl_beta and x.ref_logprobs is not None:
            kl = k3(x.logprobs, x.ref_logprobs, x.mask)
            kl_term = torch.where(x.mask, kl * x.token_weights, zero).sum()
            loss = loss + self.kl_beta * kl_term
            kl_value = float(kl_term.detach())
        with torch.no_grad():
            live = seq_weight > 0
            k = max(int(live.sum()), 1)
            metrics = {
                "clip_fraction": float(((clipped < unclipped) & live).sum()) / k,
                "ratio_mean": float(torch.where(live, s, torch.zeros_like(s)).sum()) / k,
                "kl": kl_value,
            }
        return LossOutput(loss=loss, metrics=metrics)
