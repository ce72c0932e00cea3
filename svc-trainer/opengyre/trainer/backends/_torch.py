"""The torch backend: the shared ``opengyre.models`` Llama, exactly the model the CPU engine serves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from opengyre.models import build_model, load_state, model_state, token_logprobs, token_stats

from .._packing import MicroBatch
from ._base import Backend, TokenStats

__all__ = ["TorchBackend"]


class TorchBackend(Backend):
    name: ClassVar[str] = "torch"

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        self.config: LlamaConfig = model.config
        self.model.train()
        # LM-head positions per chunk (opengyre.models.token_logprobs): None by the logits budget, 0 the whole
        # micro-batch at once (the unchunked baseline svc-trainer/bench/logits_memory_bench.py measures).
        self.chunk_tokens: int | None = None

    @classmethod
    def from_config(cls, config: LlamaConfig, seed: int = 0) -> TorchBackend:
        return cls(build_model(config, seed))

    def token_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        # No attention mask: padded rows need only causal attention (padding comes last); for packed rows the
        # restarting position ids make the model build a block-diagonal causal mask (one block per sample).
        return token_logprobs(
            self.model, mb.input_ids, position_ids=mb.position_ids, temperature=mb.temperatures,
            chunk_tokens=self.chunk_tokens,
        )  # fmt: skip

    def forward_stats(self, mb: MicroBatch) -> TokenStats:
        with torch.no_grad():  # the LM head a chunk at a time too: the whole [tokens, vocab] logits never exist
            stats = token_stats(
                self.model, mb.input_ids, mb.position_ids, mb.temperatures, chunk_tokens=self.chunk_tokens
            )
            return TokenStats(*stats)

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in model_state(self.model).items()}

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        load_state(self.model, dict(state))

    def hf_grads(self) -> dict[str, torch.Tensor]:
        return {
            k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
            for k, p in self.model.named_parameters()
        }

    def add_hf_grads(self, grads: Mapping[str, torch.Tensor]) -> None:
        for k, p in self.model.named_parameters():
            g = grads[k]
            p.grad = g.clone() if p.grad is None else p.grad + g
