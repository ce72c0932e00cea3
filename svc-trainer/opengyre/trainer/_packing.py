"""Pack samples into micro-batches under a token budget: the one input format every backend consumes.

Two layouts. *Padded* (the default): one sample per row, rows right-padded to the micro-batch's longest; with
causal attention a real token never attends to a padded one, so no mask is needed. *Packed*
(``packed=True``): several samples share a row back to back, ``position_ids`` restart at 0 for each, and
attention is block-diagonal causal (a token sees only its own sample): far less padding when lengths differ.
Either way padded positions and sample boundaries carry zero weight (a sample's first token is never a target).
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
    advantages: torch.Tensor  # [B, T-1]: each target's sample's advantage (0 elsewhere)
    lengths: torch.Tensor  # [B] real tokens per row
    execution_ids: tuple[str, ...]
    position_ids: torch.Tensor | None = None  # [B, T] for packed rows (restarting per sample); None: 0..T-1
    # [B, T-1]: the sampling temperature of each column's predicted token (1 off-target); None: 1 everywhere
    temperatures: torch.Tensor | None = None

    def segments(self) -> torch.Tensor:
        """[B, T] sample index of every position (each padding run counts as one more sample)."""
        if self.position_ids is None:
            return torch.zeros_like(self.input_ids)
        pos = self.position_ids
        starts = torch.ones_like(pos, dtype=torch.bool)
        starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
        return starts.long().cumsum(-1)

    def attention_blocked(self) -> torch.Tensor | None:
        """[B, 1, T, T] bool, True where attention is not allowed (megatron's convention): a later position or
        another sample. None for padded rows (plain causal attention)."""
        if self.position_ids is None:
            return None
        seg = self.segments()
        t = seg.shape[1]
        later = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
        other = seg.unsqueeze(-1) != seg.unsqueeze(-2)
        return (later.unsqueeze(0) | other).unsqueeze(1)

    def target_segments(self) -> torch.Tensor:
        """[B, T-1] the sample each prediction column belongs to (its predicted token's sample)."""
        return self.segments()[:, 1:]

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


def _to_batch(rows: Sequence[Sequence[TrainingSample]], *, packed: bool) -> MicroBatch:
    """One micro-batch from rows of samples placed back to back (one sample per row when padded); ``packed``
    gives each sample its own positions from 0 (padded rows need none: 0..T-1 is the default)."""
    t = max(sum(len(s.tokens) for s in row) for row in rows)
    b = len(rows)
    ids = torch.full((b, t), PAD_ID, dtype=torch.long)
    pos = torch.zeros((b, t), dtype=torch.long)
    mask = torch.zeros((b, t - 1), dtype=torch.bool)
    beh = torch.zeros((b, t - 1), dtype=torch.float32)
    w = torch.zeros((b, t - 1), dtype=torch.float32)
    adv = torch.zeros((b, t - 1), dtype=torch.float32)
    temp = torch.ones((b, t - 1), dtype=torch.float32)
    lengths = []
    for i, row in enumerate(rows):
        at = 0
        for s in row:
            n = len(s.tokens)
            ids[i, at : at + n] = torch.tensor(s.tokens, dtype=torch.long)
            pos[i, at : at + n] = torch.arange(n)
            # column c predicts token c + 1: this sample's targets 1..n-1 sit in columns at..at+n-2
            tg = torch.tensor(s.targets[1:], dtype=torch.bool)
            mask[i, at : at + n - 1] = tg
            beh[i, at : at + n - 1] = torch.tensor(s.behaviour_logprobs[1:], dtype=torch.float32)
            w[i, at : at + n - 1] = torch.where(tg, torch.tensor(s.token_weight, dtype=torch.float32), 0.0)
            adv[i, at : at + n - 1] = s.advantage
            # Off-target columns (context, tokens another path trains) are never read: 1 keeps them finite.
            temp[i, at : at + n - 1] = torch.tensor(
                [t if (t is not None and m) else 1.0 for t, m in zip(s.temperatures[1:], s.targets[1:], strict=True)],
                dtype=torch.float32,
            )
            at += n
        pos[i, at:] = torch.arange(t - at)  # the padding run is one more (ignored) sample
        lengths.append(at)
    return MicroBatch(
        input_ids=ids,
        mask=mask,
        behaviour_logprobs=beh,
        token_weights=w,
        advantages=adv,
        lengths=torch.tensor(lengths, dtype=torch.long),
        execution_ids=tuple(s.execution_id for row in rows for s in row),
        position_ids=pos if packed else None,
        temperatures=temp,
    )


def pack_samples(
    samples: Sequence[TrainingSample], max_tokens: int = 4096, *, packed: bool = False
) -> list[MicroBatch]:
    """Greedy packing, longest first, so rows of similar length share a micro-batch (little padding); a
    micro-batch's padded size ``rows * longest`` stays within ``max_tokens`` unless one sample alone exceeds it.

    ``packed``: samples placed first-fit (longest first) into rows as long as the longest sample, rows grouped
    into micro-batches of at most ``max_tokens`` tokens."""
    if packed:
        return _pack_rows(samples, max_tokens)
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
    return [_to_batch([[s] for s in rows], packed=False) for rows in batches]


def _pack_rows(samples: Sequence[TrainingSample], max_tokens: int) -> list[MicroBatch]:
    # Rows as long as the longest sample; samples placed first-fit, longest first; rows grouped into
    # micro-batches of at most ``max_tokens`` padded tokens.
    order = sorted(range(len(samples)), key=lambda i: (-len(samples[i].tokens), i))
    if not order:
        return []
    width = len(samples[order[0]].tokens)
    rows: list[list[TrainingSample]] = []
    room: list[int] = []
    for i in order:
        s = samples[i]
        for r, free in enumerate(room):
            if len(s.tokens) <= free:
                rows[r].append(s)
                room[r] -= len(s.tokens)
                break
        else:
            rows.append([s])
            room.append(width - len(s.tokens))
    per_batch = max(1, max_tokens // width)
    return [_to_batch(rows[k : k + per_batch], packed=True) for k in range(0, len(rows), per_batch)]
