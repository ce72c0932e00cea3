"""Optional KL penalty to a reference policy: the k3 estimator ``exp(r) - r - 1`` with ``r = ref - logp``
(unbiased, always >= 0, low variance)."""

from __future__ import annotations

import torch

__all__ = ["k3"]


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r = torch.where(mask, ref_logprobs - logprobs, torch.zeros_like(logprobs))
    return torch.exp(r) - r - 1.0
