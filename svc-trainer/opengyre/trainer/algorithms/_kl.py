"""Optional KL penalty to a reference policy: the k3 estimator ``exp(r) - r - 1`` with ``r = ref - logp``
(unbiased, always >= 0, low variance), clamped as verl's ``low_var_kl``: ``r`` to [-20, 20] so ``exp`` cannot
overflow, the estimate to at most 10 so one token far from the reference cannot dominate the step."""

from __future__ import annotations

import torch

__all__ = ["k3"]


def k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    r = torch.where(mask, ref_logprobs - logprobs, torch.zeros_like(logprobs)).clamp(-20.0, 20.0)
    return (torch.exp(r) - r - 1.0).clamp(min=-10.0, max=10.0)
