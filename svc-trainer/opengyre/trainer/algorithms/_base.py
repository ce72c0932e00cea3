"""What every algorithm sees and returns. The training step builds ``LossInputs`` and calls ``loss``; it never
knows which algorithm runs.

Token tensors are aligned to predictions: column ``t`` is the logprob of token ``t + 1`` given ``0..t``.
``token_weights`` are zero off-target and sum to 1 over a whole step (within-execution averaging is already
folded in), so micro-batch losses add up to the step's loss.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch

__all__ = ["Algorithm", "LossInputs", "LossOutput", "masked_sum", "per_sequence"]


@dataclass
class LossInputs:
    logprobs: torch.Tensor  # [B, T-1], with grad: the policy being trained
    old_logprobs: torch.Tensor  # [B, T-1], detached: the policy at the start of the step (the clipping anchor)
    behaviour_logprobs: torch.Tensor  # [B, T-1]: what the engine recorded when it sampled
    advantages: torch.Tensor  # [B, T-1] per target (its execution's), or [B]: one per row
    mask: torch.Tensor  # [B, T-1] bool: training targets
    token_weights: torch.Tensor  # [B, T-1]: loss weight per target, 0 elsewhere
    ref_logprobs: torch.Tensor | None = None  # [B, T-1]: a reference policy, for the optional KL term
    segments: torch.Tensor | None = None  # [B, T-1]: which sample of a packed row each column is (None: one per row)

    def token_advantages(self) -> torch.Tensor:
        a = self.advantages.to(self.logprobs.dtype)
        return a if a.dim() == 2 else a.unsqueeze(-1).expand_as(self.logprobs)

    def sequence_index(self) -> tuple[torch.Tensor, int]:
        """A flat id per (row, sample) for every column, and how many ids there are: the unit of
        sequence-level algorithms (GSPO) whether rows are padded (one sample each) or packed."""
        b, t = self.logprobs.shape
        seg = self.segments if self.segments is not None else torch.zeros((b, t), dtype=torch.long)
        width = int(seg.max()) + 1 if seg.numel() else 1
        rows = torch.arange(b, dtype=torch.long).unsqueeze(-1) * width
        return rows + seg, b * width


@dataclass
class LossOutput:
    loss: torch.Tensor  # scalar with grad
    metrics: dict[str, float]


def masked_sum(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # where(): a masked position may hold inf/nan (a padded token), and 0 * inf would poison the sum.
    return torch.where(w != 0, x * w, torch.zeros_like(x)).sum()


def per_sequence(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """Sum ``values`` [B, T-1] into ``n`` sequence slots by ``index`` (differentiable)."""
    out = torch.zeros(n, dtype=values.dtype)
    return out.index_add(0, index.reshape(-1), values.reshape(-1))


class Algorithm(ABC):
    """A loss over micro-batches, declaring what it needs from the loop (so the loop never reads its params)."""

    name: ClassVar[str]
    # What the algorithm's recipe fixes beyond the loss (None: nothing): the trainer's config takes these when
    # its own ``loss_aggregation`` / ``dynamic_sampling`` are unset and refuses a setting that contradicts them.
    loss_aggregation: ClassVar[str | None] = None
    dynamic_sampling: ClassVar[bool | None] = None

    @property
    def needs_reference(self) -> bool:
        """Whether ``LossInputs.ref_logprobs`` must be filled: a frozen reference policy (the run's starting
        weights) scores every micro-batch, e.g. for a KL term."""
        return False

    @abstractmethod
    def loss(self, x: LossInputs) -> LossOutput:
        """The weighted loss of one micro-batch (a summand of the step's loss)."""
