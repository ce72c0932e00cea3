"""The behaviour policy against the trainer's: truncated importance correction (TIS), masking of extreme
mismatch (IcePop / MIS), and the mismatch metrics a step reports.

The engine that sampled a token (a stale weight version, another kernel, another precision) is not the
policy the trainer differentiates. Weighting by ``min(pi_old / pi_behaviour, C)`` corrects the mismatch without
letting rare tokens with a tiny behaviour probability blow the gradient up (verl's and slime's TIS). Where the
ratio is far outside ``[low, high]`` the token carries no usable signal at all and is masked instead (IcePop's
and MIS's rule; GSPO applies both per sequence, with the geometric-mean ratio). ``pi_old`` is the step-start
(proximal) policy, so staleness and engine-trainer numerics are what these weights see.
"""

from __future__ import annotations

import torch

__all__ = ["behaviour_ratio", "mis_keep", "mismatch_metrics", "token_tis", "validate_bounds"]


def behaviour_ratio(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``pi_old / pi_behaviour`` per token [B, T-1] (1 off-target), without gradient."""
    return torch.exp(torch.where(mask, old - behaviour, torch.zeros_like(old))).detach()


def token_tis(old: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor, cap: float | None) -> torch.Tensor:
    """Per-token weights [B, T-1] (1 where masked out or with ``cap`` None); no gradient flows through them."""
    if cap is None:
        return torch.ones_like(old)
    return behaviour_ratio(old, behaviour, mask).clamp(max=cap)


def mis_keep(ratio: torch.Tensor, low: float | None, high: float | None) -> torch.Tensor:
    """True where the behaviour ratio is within ``[low, high]`` (a bound that is None does not apply)."""
    keep = torch.ones_like(ratio, dtype=torch.bool)
    if low is not None:
        keep &= ratio >= low
    if high is not None:
        keep &= ratio <= high
    return keep


def validate_bounds(tis_cap: float | None, mis_low: float | None, mis_high: float | None) -> None:
    if tis_cap is not None and not tis_cap >= 1.0:
        raise ValueError(f"tis_cap must be >= 1 (or None), got {tis_cap}")
    if mis_low is not None and not 0.0 <= mis_low < 1.0:
        raise ValueError(f"mis_low must be in [0, 1) (or None), got {mis_low}")
    if mis_high is not None and not mis_high > 1.0:
        raise ValueError(f"mis_high must be > 1 (or None), got {mis_high}")


def mismatch_metrics(trainer: torch.Tensor, behaviour: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """Engine vs trainer on the targets, both at the same (step-start) weights and temperature.

    ``mismatch_kl``: KL(behaviour || trainer) by the k3 estimator on the engine's own samples
    (``exp(r) - r - 1``, ``r = log pi_trainer - log pi_behaviour``; unbiased and >= 0); ``mismatch_abs_diff``:
    the mean absolute logprob difference. Staleness adds the policy's own drift to both."""
    n = max(int(mask.sum()), 1)
    zero = torch.zeros_like(trainer, dtype=torch.float64)
    # In float64: for the tiny differences of a bit-exact engine, float32 rounding makes exp(r) - r - 1 negative.
    r = torch.where(mask, trainer.double() - behaviour.double(), zero).clamp(-20.0, 20.0)
    k3 = torch.expm1(r) - r
    return {
        "mismatch_kl": float(torch.where(mask, k3, zero).sum()) / n,
        "mismatch_abs_diff": float(torch.where(mask, r.abs(), zero).sum()) / n,
    }
