"""The backend interface: a differentiable policy that turns a packed micro-batch into token logprobs.

Backends exchange weights and gradients in the Hugging Face Llama naming (``model.layers.0.self_attn.q_proj
.weight``...), the format engines load: publishing, satellite snapshots and cross-backend checks all go
through it, whatever the backend's own parameter layout.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from transformers import LlamaConfig

from .._packing import MicroBatch
from ..algorithms import LossOutput

__all__ = ["Backend", "TokenStats"]


@dataclass
class TokenStats:
    """The policy on a micro-batch, without gradient: per prediction column, the target's logprob and the
    entropy of the (temperature-scaled) distribution it was drawn from. Both [B, T-1], float32."""

    logprobs: torch.Tensor
    entropy: torch.Tensor


class Backend(ABC):
    name: ClassVar[str]
    config: LlamaConfig

    @abstractmethod
    def token_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        """log p(x_{t+1} | x_<=t) for every row, shape [B, T-1], float32, differentiable."""

    @abstractmethod
    def forward_stats(self, mb: MicroBatch) -> TokenStats | None:
        """Logprobs and entropies at the current weights, no gradient (the step-start proximal pass). None on a
        pipeline stage that holds no logits (only the last stage computes the loss)."""

    @abstractmethod
    def parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates."""

    @abstractmethod
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights as a Hugging Face Llama state dict (detached copies)."""

    @abstractmethod
    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Overwrite the weights from a Hugging Face Llama state dict."""

    @abstractmethod
    def hf_grads(self) -> dict[str, torch.Tensor]:
        """The accumulated gradients in Hugging Face naming (zeros where none flowed)."""

    @abstractmethod
    def add_hf_grads(self, grads: Mapping[str, torch.Tensor]) -> None:
        """Add gradients given in Hugging Face naming to the accumulated ones (a satellite's share)."""

    def forward_backward(self, mb: MicroBatch, loss_fn: Callable[[torch.Tensor], LossOutput]) -> LossOutput:
        """Logprobs, the loss the caller builds from them, and its backward pass (gradients accumulate).

        Pipeline-parallel backends override this: only their last stage sees logprobs, the others exchange
        activations and gradients; every rank returns the same loss value and metrics.
        """
        out = loss_fn(self.token_logprobs(mb))
        out.loss.backward()  # type: ignore[no-untyped-call]
        return out

    def grad_norm(self) -> float:
        """The global L2 norm of the accumulated gradients (across model-parallel ranks where sharded)."""
        sq = [p.grad.detach().double().pow(2).sum() for p in self.parameters() if p.grad is not None]
        return math.sqrt(float(torch.stack(sq).sum())) if sq else 0.0

    def zero_grad(self) -> None:
        for p in self.parameters():
            p.grad = None

    def data_parallel(self, rank: int, world: int, replicas: int) -> tuple[int, int, Any]:
        """How this backend runs data-parallel when ``world`` ranks hold ``replicas`` model copies: this
        rank's replica index, the number of replicas and the process group their gradients reduce over
        (None: the default group, every rank one replica)."""
        return rank, world, None
