"""The LM head a chunk of positions at a time: the same logprobs, entropies and gradients as the whole logits at
once, bit for bit, however the chunks cut the micro-batch (rows, packed samples, temperatures)."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig

from opengyre.models import build_model, logits_chunk_tokens, model_config, token_logprobs, token_stats


def _batch(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 288, (3, 23), generator=g)
    # two packed samples per row (positions restart at 11), as the trainer's packed micro-batches carry
    pos = torch.cat([torch.arange(11), torch.arange(12)]).expand(3, -1).contiguous()
    temp = torch.where(torch.rand(3, 22, generator=g) < 0.5, 0.7, 1.0)
    return ids, pos, temp


def _grads(model: torch.nn.Module, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    loss.backward()  # type: ignore[no-untyped-call]
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


# Cuts across rows and samples, uneven, exact, beyond the batch. (At the tiny model's 64-wide hidden size a GEMM
# of fewer than 16 rows may take another MKL kernel, 1 ulp apart; the default chunk is hundreds of rows.)
@pytest.mark.parametrize("chunk", [16, 17, 22, 40, 66, 500])
def test_chunked_logprobs_and_gradients_equal_the_whole_logits_at_once(chunk: int) -> None:
    model = build_model(model_config("tiny"), seed=3)
    ids, pos, temp = _batch(1)
    whole = token_logprobs(model, ids, position_ids=pos, temperature=temp, chunk_tokens=0)
    chunked = token_logprobs(model, ids, position_ids=pos, temperature=temp, chunk_tokens=chunk)
    assert chunked.shape == whole.shape == (3, 22)
    assert torch.equal(chunked, whole)
    weights = torch.randn(3, 22, generator=torch.Generator().manual_seed(2))  # a loss that weighs every position
    g_whole = _grads(model, (whole * weights).sum())
    g_chunked = _grads(model, (chunked * weights).sum())
    assert g_whole.keys() == g_chunked.keys() and "lm_head.weight" in g_whole
    for k, g in g_whole.items():
        torch.testing.assert_close(g_chunked[k], g, rtol=1e-5, atol=1e-6, msg=k)


def test_chunked_entropies_equal_the_whole_logits_at_once() -> None:
    model = build_model(model_config("tiny"), seed=3)
    ids, pos, temp = _batch(4)
    with torch.no_grad():
        lp0, ent0 = token_stats(model, ids, pos, temp, chunk_tokens=0)
        lp1, ent1 = token_stats(model, ids, pos, temp, chunk_tokens=19)
    assert torch.equal(lp1, lp0) and torch.equal(ent1, ent0)
    assert bool((ent0 > 0).all())


def test_the_chunk_follows_the_logits_budget_and_bad_sizes_are_refused() -> None:
    assert logits_chunk_tokens(49_152) == 341  # SmolLM2: 64 MiB of float32 logits per chunk
    assert logits_chunk_tokens(49_152, 1) == 1
    with pytest.raises(ValueError, match="vocab_size and budget_bytes must be >= 1"):
        logits_chunk_tokens(0)
    model = build_model(model_config("tiny"), seed=0)
    with pytest.raises(ValueError, match="chunk_tokens must be >= 0, got -1"):
        token_logprobs(model, torch.zeros(1, 4, dtype=torch.long), chunk_tokens=-1)


def test_at_smollm2s_vocabulary_the_default_chunks_equal_the_whole_logits() -> None:
    """The real head's shape (576 -> 49,152, tied), two layers, random weights: 3 chunks of 341 + an even split."""
    cfg = LlamaConfig(
        vocab_size=49_152, hidden_size=576, intermediate_size=1536, num_hidden_layers=2, num_attention_heads=9,
        num_key_value_heads=3, tie_word_embeddings=True, max_position_embeddings=2048,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    model = build_model(cfg, seed=0)
    ids = torch.randint(0, 49_152, (1, 801), generator=torch.Generator().manual_seed(0))
    temp = torch.full((1, 800), 0.7)
    with torch.no_grad():
        whole = token_logprobs(model, ids, temperature=temp, chunk_tokens=0)
        chunked = token_logprobs(model, ids, temperature=temp)
    assert logits_chunk_tokens(cfg.vocab_size) < 800 and torch.equal(chunked, whole)
