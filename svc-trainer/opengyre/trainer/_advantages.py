"""Group-relative advantages: each member's reward against its group's surviving members."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["group_advantages"]


def group_advantages(
    rewards: Sequence[float], *, normalize_std: bool = True, eps: float = 1e-6
) -> tuple[list[float], float, float]:
    """(advantages, mean, std). Fewer than two rewards carry no relative signal: all advantages are 0.

    ``std`` is the sample standard deviation (n - 1), as GRPO's reference implementation uses; with
    ``normalize_std=False`` (Dr. GRPO) the advantage is the centred reward only.
    """
    n = len(rewards)
    if n < 2:
        return [0.0] * n, (float(rewards[0]) if n else 0.0), 0.0
    mean = math.fsum(rewards) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (n - 1))
    if std == 0.0:
        return [0.0] * n, mean, 0.0
    scale = (std + eps) if normalize_std else 1.0
    return [(r - mean) / scale for r in rewards], mean, std
