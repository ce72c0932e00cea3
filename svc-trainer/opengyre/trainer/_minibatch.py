"""A step's samples as mini-batches: whole executions each, packed into micro-batches, with their normaliser.

Executions are dealt round-robin after a shuffle seeded by the run and the step, so mini-batches differ in
size by at most one execution and a step is reproducible. Each mini-batch is one optimizer update and divides
its loss by its own normaliser (the weighting rule of ``_samples`` over what it trains).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from ._packing import pack_samples
from ._samples import LossAggregation, TrainingSample, loss_normaliser
from ._step import MiniBatch

__all__ = ["plan_minibatches"]


def plan_minibatches(
    samples: Sequence[TrainingSample],
    *,
    mini_batches: int,
    aggregation: LossAggregation,
    norm_tokens: int | None,
    micro_batch_tokens: int,
    packed: bool,
    seed: int,
    step: int,
) -> list[MiniBatch]:
    executions = sorted({s.execution_id for s in samples})
    random.Random(f"{seed}:{step}:minibatches").shuffle(executions)
    k = min(mini_batches, len(executions))
    out = []
    for i in range(k):
        mine = set(executions[i::k])
        part = [s for s in samples if s.execution_id in mine]
        out.append(
            MiniBatch(
                pack_samples(part, micro_batch_tokens, packed=packed), loss_normaliser(part, aggregation, norm_tokens)
            )
        )
    return out
