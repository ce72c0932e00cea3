"""Training samples: one drawn path as tokens, targets, behaviour logprobs, advantage and loss weight; and
the one weighting rule of a step's loss, the same for batch and streaming steps.

An update's loss is ``sum over targets of token_weight * per-token loss``, divided by the update's
``loss_normaliser``. Three aggregations (``LOSS_AGGREGATIONS``):

- ``execution-mean`` (the default, QwenGyre's): every target of an execution weighs ``1 / (its targets)`` and
  the normaliser is the number of executions: each execution weighs the same however long or branched it is.
  Per token, a long execution's tokens weigh less: the length bias of GRPO's ``1/|o|`` (Dr. GRPO).
- ``token-mean`` (DAPO's): every target weighs 1, the normaliser is the number of targets: each token weighs the
  same, so long executions weigh more.
- ``constant`` (Dr. GRPO's): every target weighs 1, the normaliser is ``executions x norm_tokens`` (a constant
  length): no length normalisation at all, so neither bias.

The normaliser counts what is actually trained (after every drop), so groups without signal leave nothing
unused; a streaming step learns it when its last group is in and divides the accumulated gradients by it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from opengyre.trajectory import is_logprob

from ._sampling import SampledPath

__all__ = [
    "LOSS_AGGREGATIONS",
    "LossAggregation",
    "SampleError",
    "TrainingSample",
    "execution_samples",
    "execution_weight",
    "loss_normaliser",
]

LossAggregation = Literal["execution-mean", "token-mean", "constant"]
LOSS_AGGREGATIONS: tuple[str, ...] = get_args(LossAggregation)


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
    # The sampling temperature of each position's call (None: unknown); every target must have one.
    temperatures: tuple[float | None, ...] = ()

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
        if len(self.temperatures) != n:
            raise SampleError(f"{self.execution_id}/{self.leaf}: {len(self.temperatures)} temperatures for {n}")
        unknown = [t for t, m in zip(self.temperatures, self.targets, strict=True) if m and not _is_temperature(t)]
        if unknown:
            raise SampleError(f"{self.execution_id}/{self.leaf}: a target's sampling temperature is {unknown[0]}")
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


def _is_temperature(t: float | None) -> bool:
    return t is not None and math.isfinite(t) and t > 0


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
            temperatures=p.path.temperatures,
        )
        for p in paths
        if p.n_targets > 0
    ]


def execution_weight(aggregation: LossAggregation, n_targets: int) -> float:
    """The sum of an execution's token weights before the update's normaliser: 1 per execution
    (``execution-mean``), or 1 per target token (``token-mean``, ``constant``)."""
    if aggregation == "execution-mean":
        return 1.0
    if aggregation in ("token-mean", "constant"):
        return float(n_targets)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; known: {', '.join(LOSS_AGGREGATIONS)}")


def loss_normaliser(
    samples: Sequence[TrainingSample], aggregation: LossAggregation, norm_tokens: int | None = None
) -> float:
    """What an update over ``samples`` (weighted by ``execution_weight``) divides its summed loss by."""
    executions = len({s.execution_id for s in samples})
    if not executions:
        return 1.0
    if aggregation == "execution-mean":
        return float(executions)
    if aggregation == "token-mean":
        return float(max(sum(s.n_targets for s in samples), 1))
    if aggregation == "constant":
        if norm_tokens is None or norm_tokens < 1:
            raise ValueError("the constant loss aggregation needs norm_tokens >= 1 (Dr. GRPO's constant length)")
        return float(executions * norm_tokens)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; known: {', '.join(LOSS_AGGREGATIONS)}")
