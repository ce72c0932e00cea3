"""Truncated importance correction (TIS) against the recorded behaviour logprobs.

The engine that sampled a token (a stale weight version, another kernel, another precision) is not the
policy the trainer differentiates. Weighting by ``min(pi_old / pi_behaviour, C)`` corrects the mismatch
without letting rare tokens with a tiny behaviour probability blow the gradient up.
"""

from __future__ import annotations

import torch

__all__ = ["sequence_tis", "token_tis"]


def token_tis(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Per-token weights [B, T-1] (1 where masked out or with ``cap`` None); no gradient flows through them."""
    if cap is None:
        return torch.ones_like(old)
    ratio = torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old))).detach()
    return ratio.clamp(max=cap)


def sequence_tis(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Per-sequence weights [B]: the geometric-mean ratio over the sequence's targets, capped."""
    if cap is None:
        return torch.ones(old.shape[0], dtype=old.dtype)
    m = mask.to(old.dtype)
    n = m.sum(-1).clamp(min=1.0)
    log_ratio = (torch.where(mask, old - behaviour, torch.zeros_like(old)) * m).sum(-1) / n
    return torch.exp(log_ratio).detach().clamp(max=cap)
