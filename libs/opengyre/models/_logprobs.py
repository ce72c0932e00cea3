"""Token logprobs of the policy, the trainer's and the engine's prompt logprobs: ``log_softmax(logits / T)``.

The logits are the big tensor: [tokens, vocab] float32 is 805 MB for a 4096-token micro-batch of SmolLM2's
49k vocabulary, and the temperature division, the log-softmax and, in backward, their gradients each make another
one. ``token_logprobs`` therefore runs the LM head and the log-softmax a chunk of positions at a time (at most
``LOGITS_CHUNK_BYTES`` of logits) and, with gradients on, recomputes each chunk in backward instead of keeping
its logits (activation checkpointing): the step's peak no longer grows with tokens × vocab. The values are the
unchunked ones bit for bit (each row's logits are the same dot products whatever the chunk).
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint
from transformers import LlamaForCausalLM

__all__ = ["LOGITS_CHUNK_BYTES", "logits_chunk_tokens", "target_logprobs", "token_logprobs", "token_stats"]

# float32 logits held at once per chunk: 64 MiB is 341 positions of a 49,152-token vocabulary; small enough that
# the chunk's few vocab-wide temporaries stay under a few hundred MB, large enough that the LM head's GEMM is not
# starved (M in the hundreds).
LOGITS_CHUNK_BYTES = 64 * 2**20


def logits_chunk_tokens(vocab_size: int, budget_bytes: int = LOGITS_CHUNK_BYTES) -> int:
    """Positions per chunk so that one chunk's float32 logits fit ``budget_bytes`` (at least 1)."""
    if vocab_size < 1 or budget_bytes < 1:
        raise ValueError(f"vocab_size and budget_bytes must be >= 1, got {vocab_size} and {budget_bytes}")
    return max(1, budget_bytes // (vocab_size * 4))


def target_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor | None = None,
    *,
    entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) under ``softmax(logits / temperature)`` per position, and the distribution's entropy.

    ``logits`` [..., V] (any float type; computed in float32), ``targets`` [...], ``temperature`` [...] (None:
    1). The division is the engine's (``sample_next``: logits / temperature, then log_softmax), so the trainer's
    logprobs are the behaviour logprobs the engine records for the same weights and temperature."""
    x = logits.float()
    if temperature is not None:
        x = x / temperature.to(x.dtype).unsqueeze(-1)
    lsm = torch.log_softmax(x, dim=-1)
    lp = lsm.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return lp, (-(lsm.exp() * lsm).sum(-1) if entropy else None)


def _chunk(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None
) -> torch.Tensor:
    return target_logprobs(head(hidden), targets, temperature)[0]


def _chunk_stats(
    head: torch.nn.Module, hidden: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    lp, ent = target_logprobs(head(hidden), targets, temperature, entropy=True)
    assert ent is not None
    return lp, ent


def token_logprobs(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    position_ids: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    *,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """log p(x_t | x_<t) for t = 1..T-1, shape [B, T-1] (float32), at ``temperature`` [B, T-1] (None: 1).

    ``position_ids`` restarting at 0 inside a row mark packed sequences: attention stays within each one.
    ``chunk_tokens``: positions per LM-head chunk (None: ``logits_chunk_tokens`` of the vocabulary; 0: the whole
    micro-batch's logits at once, kept for backward, as before the chunking: the measured baseline)."""
    return _logprobs(model, input_ids, attention_mask, position_ids, temperature, False, chunk_tokens)[0]


def token_stats(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    *,
    chunk_tokens: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``token_logprobs`` and the entropy of each of those distributions, both [B, T-1] float32."""
    lp, ent = _logprobs(model, input_ids, None, position_ids, temperature, True, chunk_tokens)
    assert ent is not None
    return lp, ent


def _logprobs(
    model: LlamaForCausalLM,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None,
    temperature: torch.Tensor | None,
    entropy: bool,
    chunk_tokens: int | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    targets = input_ids[:, 1:]
    if chunk_tokens == 0:
        logits = model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).logits[:, :-1]
        return target_logprobs(logits, targets, temperature, entropy=entropy)
    n = chunk_tokens if chunk_tokens is not None else logits_chunk_tokens(model.config.vocab_size)
    if n < 0:
        raise ValueError(f"chunk_tokens must be >= 0, got {n}")
    out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    rows, cols = targets.shape
    # Even chunks of at most n: no short tail (a GEMM of a few rows may take another MKL kernel, 1 ulp apart).
    n = -(-rows * cols // -(-rows * cols // n))
    hidden = out.last_hidden_state[:, :-1].reshape(rows * cols, -1)
    flat_t = targets.reshape(-1)
    flat_temp = temperature.reshape(-1) if temperature is not None else None
    head = model.lm_head
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for i in range(0, rows * cols, n):
        args = (head, hidden[i : i + n], flat_t[i : i + n], None if flat_temp is None else flat_temp[i : i + n])
        if entropy:
            lp, ent = checkpoint(_chunk_stats, *args, use_reentrant=False) if recompute else _chunk_stats(*args)
            ents.append(ent)
        else:
            lp = checkpoint(_chunk, *args, use_reentrant=False) if recompute else _chunk(*args)
        lps.append(lp)
    return torch.cat(lps).reshape(rows, cols), (torch.cat(ents).reshape(rows, cols) if entropy else None)
