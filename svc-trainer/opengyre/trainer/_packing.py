"""Pack samples into micro-batches under a token budget: the one input format every backend consumes.

Rows are right-padded to the micro-batch's longest sample. With causal attention a real token never attends
to a padded one (padding comes after it), so no attention mask is needed and both backends see identical
inputs; padded positions carry zero weight and never reach the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ._samples import TrainingSample

__all__ = ["PAD_ID", "MicroBatch", "pack_samples"]

PAD_ID = 256  # <|endoftext|> of the shipped tokenizer


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] long
    mask: torch.Tensor  # [B, T-1] bool: column t predicts token t+1
    behaviour_logprobs: torch.Tensor  # [B, T-1]
    token_weights: torch.Tensor  # [B, T-1]
    advantages: torch.Tensor  # [B]
    lengths: torch.Tensor  # [B] real tokens per row
    execution_ids: tuple[str, ...]

    @property
    def n_targets(self) -> int:
        return int(self.mask.sum())

    @property
    def n_tokens(self) -> int:
        """Real (unpadded) tokens: what a forward/backward pass processes."""
        return int(self.lengths.sum())

    @property
    def padded_tokens(self) -> int:
        return int(self.input_ids.numel())


def _to_batch(rows: Sequence[TrainingSample]) -> MicroBatch:
    t = max(len(s.tokens) for s in rows)
    b = len(rows)
    ids = torch.full((b, t), PAD_ID, dtype=torch.long)
    mask = torch.zeros((b, t - 1), dtype=torch.bool)
    beh = torch.zeros((b, t - 1), dtype=torch.float32)
    w = torch.zeros((b, t - 1), dtype=torch.float32)
    for i, s in enumerate(rows):
        n = len(s.tokens)
        ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        tg = torch.tensor(s.targets[1:], dtype=torch.bool)
        mask[i, : n - 1] = tg
        beh[i, : n - 1] = torch.tensor(s.behaviour_logprobs[1:], dtype=torch.float32)
        w[i, : n - 1] = torch.where(tg, torch.tensor(s.token_weight, dtype=torch.float32), 0.0)
    return MicroBatch(
        input_ids=ids,
        mask=mask,
        behaviour_logprobs=beh,
        token_weights=w,
        advantages=torch.tensor([s.advantage for s in rows], dtype=torch.float32),
        lengths=torch.tensor([len(s.tokens) for s in rows], dtype=torch.long),
        execution_ids=tuple(s.execution_id for s in rows),
    )


def pack_samples(samples: Sequence[TrainingSample], max_tokens: int = 4096) -> list[MicroBatch]:
    """Greedy packing, longest first, so rows of similar length share a micro-batch (little padding); a
    micro-batch's padded size ``rows * longest`` stays within ``max_tokens`` unless one sample alone exceeds it."""
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].tokens), i))
    batches: list[list[TrainingSample]] = []
    cur: list[TrainingSample] = []
    for i in order:
        s = samples[i]
        longest = len(cur[0].tokens) if cur else len(s.tokens)
        if cur and (len(cur) + 1) * longest > max_tokens:
            batches.append(cur)
            cur = []
        cur.append(s)
    if cur:
        batches.append(cur)
    return [_to_batch(rows) for rows in batches]
