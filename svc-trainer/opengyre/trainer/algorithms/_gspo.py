"""GSPO: a sequence-level importance ratio, clipped per sequence.

``s = exp(mean_t(log pi - log pi_old))`` over the sequence's targets (``pi_old``: the step-start, proximal
policy); the sequence's loss is ``-min(s * A, clip(s, 1 - eps_low, 1 + eps_high) * A)``, weighted by the
sequence's share of the step (the sum of its token weights, so the weighting rule holds here too). Clipping
bounds are much tighter than token-level ones because a length-normalised ratio moves little. A sequence is one
sample: a padded row, or one of the samples sharing a packed row. The behaviour correction works per sequence
too: the geometric-mean ratio ``pi_old / pi_behaviour`` is truncated at ``tis_cap``, and a sequence whose ratio
is outside ``[mis_low, mis_high]`` is masked whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput, per_sequence
from ._importance import mis_keep, validate_bounds
from ._kl import k3

__all__ = ["GSPO"]


@dataclass
class GSPO(Algorithm):
    name: ClassVar[str] = "gspo"
    eps_low: float = 3e-4
    eps_high: float = 4e-4
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
        idx, n = x.sequence_index()
        m = x.mask.to(x.logprobs.dtype)
        count = per_sequence(m, idx, n)
        denom = count.clamp(min=1.0)
        drift = per_sequence(torch.where(x.mask, x.old_logprobs - x.behaviour_logprobs, zero), idx, n) / denom
        w = torch.exp(drift).detach()  # the geometric-mean pi_old / pi_behaviour of each sequence
        live = (count > 0) & mis_keep(w, self.mis_low, self.mis_high)
        seq_log_ratio = per_sequence(torch.where(x.mask, x.logprobs - x.old_logprobs, zero), idx, n) / denom
        s = torch.exp(torch.where(live, seq_log_ratio, torch.zeros_like(seq_log_ratio)))
        adv = per_sequence(torch.where(x.mask, x.token_advantages(), zero), idx, n) / denom
        unclipped = s * adv
        clipped = s.clamp(1.0 - self.eps_low, 1.0 + self.eps_high) * adv
        per_seq = -torch.minimum(unclipped, clipped)
        tis = w.clamp(max=self.tis_cap) if self.tis_cap is not None else torch.ones_like(w)
        per_seq = per_seq * tis
        seq_weight = per_sequence(torch.where(x.mask, x.token_weights, zero), idx, n)
        seq_weight = torch.where(live, seq_weight, torch.zeros_like(seq_weight))
        loss = (per_seq * seq_weight).sum()
        kl_value = 0.0
        if self.kl_beta and x.ref_logprobs is not None:
            kept_tokens = x.mask & live[idx]
            kl = k3(x.logprobs, x.ref_logprobs, kept_tokens)
            kl_term = torch.where(kept_tokens, kl * x.token_weights, zero).sum()
            loss = loss + self.kl_beta * kl_term
            kl_value = float(kl_term.detach())
        with torch.no_grad():
            k = max(int((count > 0).sum()), 1)
            metrics = {
                "clip_fraction": float(((clipped < unclipped) & live).sum()) / k,
                "ratio_mean": float(torch.where(live, s, torch.zeros_like(s)).sum()) / k,
                "tis_mean": float(torch.where(live, tis, torch.zeros_like(tis)).sum()) / k,
                "tis_clip_fraction": float(((w > self.tis_cap) & live).sum()) / k if self.tis_cap else 0.0,
                "mis_masked_fraction": float(((count > 0) & ~live).sum()) / k,
                "kl": kl_value,
            }
        return LossOutput(loss=loss, metrics=metrics)
