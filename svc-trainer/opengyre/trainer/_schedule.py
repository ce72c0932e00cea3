"""The learning rate of a step: linear warmup, then constant, linear or cosine decay to a floor.

A function of the step number alone, so a restarted trainer continues the schedule without any state.
"""

from __future__ import annotations

import math

__all__ = ["lr_at"]


def lr_at(
    step: int,
    base: float,
    *,
    warmup: int = 0,
    schedule: str = "constant",
    decay_steps: int | None = None,
    min_ratio: float = 0.0,
) -> float:
    """The learning rate of step ``step`` (the first step is 1)."""
    if warmup and step <= warmup:
        return base * step / warmup
    if schedule == "constant":
        return base
    if decay_steps is None or decay_steps <= warmup:
        raise ValueError("a decaying schedule needs decay_steps > warmup")
    progress = min(max(step - warmup, 0) / (decay_steps - warmup), 1.0)
    if schedule == "linear":
        left = 1.0 - progress
    elif schedule == "cosine":
        left = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        raise ValueError(f"unknown lr schedule {schedule!r}")
    return base * (min_ratio + (1.0 - min_ratio) * left)
