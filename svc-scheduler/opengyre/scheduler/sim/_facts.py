"""Facts about the paper's runs that the simulator's costs depend on: published where the paper or its news
coverage gives them, assumed (and marked so) where they do not. Workload files carry the same fields."""

from __future__ import annotations

from ._costs import ModelFacts

__all__ = ["QWEN36_122B"]

# Qwen3.6-122B on NL2RepoBench (QwenGyre). Published: 122B parameters, ~1M tokens per rollout. Assumed: 10B
# active (the Qwen3.5/3.6 family's 122B-A10B), the family's hybrid attention (48 layers, every 4th full
# attention: 12 layers of 32 query heads x 256, 2 KV heads x 256 in bf16 = 24,576 KV bytes per token), and
# that the trainer runs about as many tokens per execution as its context holds.
QWEN36_122B = ModelFacts(
    name="qwen3.6-122b",
    params_b=122.0,
    active_params_b=10.0,
    attention_layers=12,
    attention_width=32 * 256,
    kv_bytes_per_token=12 * 2 * 256 * 2 * 2,
    context_tokens=1.0e6,
    trained_tokens=1.0e6,
)
