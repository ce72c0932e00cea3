"""GSPO: a sequence-level importance ratio, clipped per sequence.

``s = exp(mean_t(log pi - log pi_old))`` over the sequence's targets; the sequence's loss is
``-min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A)``, weighted by the sequence's share of the step (the sum
of its token weights, so within-execution averaging holds here too). Clipping bounds are much tighter than
token-level ones because a length-normalised ratio moves little. A sequence is one sample: a padded row, or one
of the samples sharing a packed row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput, per_sequence
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
        idx, n = x.sequence_index()
        m = x.mask.to(x.logprobs.dtype)
        count = per_sequence(m, idx, n)
        live = count > 0
        denom = count.clamp(min=1.0)
        seq_log_ratio = per_sequence(torch.where(x.mask, x.logprobs - x.old_logprobs, zero), idx, n) / denom
        s = torch.exp(seq_log_ratio)
        adv = per_sequence(torch.where(x.mask, x.token_advantages(), zero), idx, n) / denom
        unclipped = s * adv
        clipped = s.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * adv
        per_seq = -torch.minimum(unclipped, clipped)
        if self.tis_cap is not None:
            # Truncated importance correction per sequence: the geometric-mean ratio pi_old / pi_behaviour.
            drift = per_sequence(torch.where(x.mask, x.old_logprobs - x.behaviour_logprobs, zero), idx, n) / denom
            per_seq = per_seq * torch.exp(drift).detach().clamp(max=self.tis_cap)
        seq_weight = per_sequence(torch.where(x.mask, x.token_weights, zero), idx, n)
        loss = (per_seq * seq_weight).sum()
        kl_value = 0.0
        if self.kl_beta and x.ref_logprobs is not None:
            kl = k3(x.logprobs, x.ref_logprobs, x.mask)
            kl_term = torch.where(x.mask, kl * x.token_weights, zero).sum()
            loss = loss + self.kl_beta * kl_term
            kl_value = float(kl_term.detach())
        with torch.no_grad():
            k = max(int(live.sum()), 1)
            metrics = {
                "clip_fraction": float(((clipped < unclipped) & live).sum()) / k,
                "ratio_mean": float(torch.where(live, s, torch.zeros_like(s)).sum()) / k,
                "kl": kl_value,
            }
        return LossOutput(loss=loss, metrics=metrics)
