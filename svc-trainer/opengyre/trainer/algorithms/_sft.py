"""Supervised fine-tuning on golden trajectories: weighted negative log-likelihood of the target tokens.

It runs on the same samples, packing and backends as RL; advantages and behaviour logprobs are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from ._base import Algorithm, LossInputs, LossOutput, masked_sum

__all__ = ["SFT"]


@dataclass
class SFT(Algorithm):
    name: ClassVar[str] = "sft"

    def loss(self, x: LossInputs) -> LossOutput:
        loss = masked_sum(-x.logprobs, x.token_weights)
        with torch.no_grad():
            n = max(int(x.mask.sum()), 1)
            nll = float(torch.where(x.mask, -x.logprobs, torch.zeros_like(x.logprobs)).sum()) / n
        return LossOutput(loss=loss, metrics={"nll": nll})
