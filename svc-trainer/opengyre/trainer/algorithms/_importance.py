"""Truncated importance correction (TIS) against the recorded behaviour logprobs (per token here; GSPO
applies the same correction per sequence, with the geometric-mean ratio).

The engine that sampled a token (a stale weight version, another kernel, another precision) is not the
policy the trainer differentiates. Weighting by ``min(pi_old / pi_behaviour, C)`` corrects the mismatch
without letting rare tokens with a tiny behaviour probability blow the gradient up.
"""

from __future__ import annotations

import torch

__all__ = ["token_tis"]


def token_tis(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Per-token weights [B, T-1] (1 where masked out or with ``cap`` None); no gradient flows through them."""
    if cap is None:
        return torch.ones_like(old)
    ratio = torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old))).detach()
    return ratio.clamp(max=cap)
