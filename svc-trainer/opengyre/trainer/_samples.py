"""Training samples: one drawn path as tokens, targets, behaviour logprobs, advantage and loss weight.

The loss is averaged *within an execution*: every target token of an execution gets weight
``1 / (targets in the execution)``, times the execution's share of the step (``1 / executions``), so an
execution with many branches weighs as much as a single-path one and a whole step's weights sum to 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ._sampling import SampledPath

__all__ = ["SampleError", "TrainingSample", "execution_samples", "is_logprob"]


class SampleError(ValueError):
    """A sample whose parts do not line up (mismatched lengths, non-finite values): never trained on."""


@dataclass(frozen=True, slots=True)
class TrainingSample:
    execution_id: str
    leaf: str
    tokens: tuple[int, ...]
    targets: tuple[bool, ...]  # position t is a training target (predicted from t-1)
    behaviour_logprobs: tuple[float, ...]  # the engine's logprob at each position (0.0 where not generated)
    advantage: float
    token_weight: float  # loss weight of each target token of this sample
    weight_versions: tuple[str, ...] = ()  # the weight version that generated each position ("" for context)

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n < 2:
            raise SampleError(f"{self.execution_id}/{self.leaf}: a sample needs at least 2 tokens, got {n}")
        if len(self.targets) != n or len(self.behaviour_logprobs) != n:
            raise SampleError(
                f"{self.execution_id}/{self.leaf}: {n} tokens but {len(self.targets)} target flags and "
                f"{len(self.behaviour_logprobs)} behaviour logprobs"
            )
        if self.weight_versions and len(self.weight_versions) != n:
            raise SampleError(f"{self.execution_id}/{self.leaf}: {len(self.weight_versions)} version stamps for {n}")
        if self.targets[0]:
            raise SampleError(f"{self.execution_id}/{self.leaf}: position 0 cannot be a target")
        if any(t < 0 for t in self.tokens):
            raise SampleError(f"{self.execution_id}/{self.leaf}: negative token id")
        bad = [lp for lp, m in zip(self.behaviour_logprobs, self.targets, strict=True) if m and not is_logprob(lp)]
        if bad:
            raise SampleError(f"{self.execution_id}/{self.leaf}: behaviour logprob {bad[0]} is not a log probability")
        if not math.isfinite(self.advantage) or not math.isfinite(self.token_weight) or self.token_weight < 0:
            raise SampleError(f"{self.execution_id}/{self.leaf}: non-finite advantage or weight")

    @property
    def n_targets(self) -> int:
        return sum(self.targets)


def is_logprob(x: float) -> bool:
    """A log probability, allowing float noise above 0 (the projection refuses calls with anything else)."""
    return math.isfinite(x) and x <= 1e-6


def execution_samples(
    execution_id: str,
    paths: Sequence[SampledPath],
    advantage: float,
    execution_share: float = 1.0,
) -> list[TrainingSample]:
    """Samples of one execution's drawn paths; their target weights sum to ``execution_share``."""
    total = sum(p.n_targets for p in paths)
    if total == 0:
        return []
    w = execution_share / total
    return [
        TrainingSample(
            execution_id=execution_id,
            leaf=p.path.leaf,
            tokens=p.path.tokens,
            targets=p.targets,
            behaviour_logprobs=p.path.behaviour_logprobs,
            advantage=advantage,
            token_weight=w,
            weight_versions=p.path.weight_versions,
        )
        for p in paths
        if p.n_targets > 0
    ]
