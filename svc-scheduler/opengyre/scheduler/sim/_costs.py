"""What moving a running execution costs when its cell leaves rollout, from the model and the context it holds.

The proxy re-issues a moved execution's in-flight model call on another engine. Either the new engine
recomputes the call's whole context (re-prefill, the proxy's default ``RePrefill`` migrator) or the KV cache is
copied over the network first (the ``KVMigrator`` hook, the paper's RDMA transfer). An execution's context
grows with its progress, linearly up to ``context_tokens`` at its end (no compaction: the upper end).

Re-prefill costs ``2 * active_params * n + 2 * attention_layers * attention_width * n**2`` FLOPs for ``n``
context tokens (the projections and MLP, then causal attention in the layers that keep a KV cache). The
engine's other executions wait while it runs, so the whole GPU-time is charged to the moved execution's slot:
its slot is held ``gpu_seconds / gpus_per_slot`` longer (work-conserving). A KV migration holds the slot while
``kv_bytes_per_token * n`` bytes cross the link, and costs no GPU compute.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["MOVE_MODES", "GpuFacts", "ModelFacts", "MoveCost", "MoveMode"]

MoveMode = Literal["free", "re-prefill", "kv-migration"]
MOVE_MODES: tuple[MoveMode, ...] = ("free", "re-prefill", "kv-migration")


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """The policy model and one execution's tokens, as far as scheduling costs depend on them."""

    name: str
    params_b: float  # total parameters, billions (weights to hold)
    active_params_b: float  # parameters used per token (MoE: the active ones), billions
    attention_layers: int  # layers whose KV cache grows with the context (full attention)
    attention_width: int  # query heads x head dim in those layers (the quadratic prefill term)
    kv_bytes_per_token: float  # KV cache bytes per context token, all such layers together
    context_tokens: float  # an execution's context when it ends
    trained_tokens: float  # tokens of one execution the trainer runs forward and backward

    def validate(self) -> None:
        if min(self.params_b, self.active_params_b, self.context_tokens, self.trained_tokens) <= 0:
            raise ValueError(f"model {self.name}: parameters and token counts must be > 0")
        if self.attention_layers < 0 or self.attention_width < 0 or self.kv_bytes_per_token < 0:
            raise ValueError(f"model {self.name}: attention shape and KV size must be >= 0")

    def prefill_flops(self, tokens: float) -> float:
        dense = 2.0 * self.active_params_b * 1e9 * tokens
        return dense + 2.0 * self.attention_layers * self.attention_width * tokens**2

    def train_flops(self, executions: float) -> float:
        """Forward and backward over ``executions`` executions' trained tokens (6 FLOPs per parameter-token)."""
        return 6.0 * self.active_params_b * 1e9 * self.trained_tokens * executions


@dataclass(frozen=True, slots=True)
class GpuFacts:
    """One accelerator. The GPU model behind the paper's runs is not published: these are assumptions."""

    flops: float = 989e12  # dense bf16 peak, FLOP/s (an H100/H800-class GPU)
    mfu: float = 0.4  # the share of peak a long-context prefill or training step sustains
    link_bytes_per_s: float = 50e9  # per-engine RDMA bandwidth for a KV migration (one 400 Gb/s NIC)
    link_latency_s: float = 0.5  # pinning, handshake and hand-over of a migration

    def validate(self) -> None:
        if self.flops <= 0 or not 0 < self.mfu <= 1 or self.link_bytes_per_s <= 0 or self.link_latency_s < 0:
            raise ValueError(f"invalid GPU facts: {self}")


@dataclass(frozen=True, slots=True)
class MoveCost:
    mode: MoveMode = "free"
    model: ModelFacts | None = None
    gpu: GpuFacts = field(default_factory=GpuFacts)

    def validate(self) -> None:
        if self.mode not in MOVE_MODES:
            raise ValueError(f"move cost mode {self.mode!r}; known: {', '.join(MOVE_MODES)}")
        if self.mode != "free" and self.model is None:
            raise ValueError(f"move cost {self.mode!r} needs the model's facts (context, size, attention shape)")
        if self.model is not None:
            self.model.validate()
        self.gpu.validate()

    def seconds(self, progress: float, gpus_per_slot: float) -> float:
        """Extra slot-seconds an execution ``progress`` (0..1) of the way through pays for being moved."""
        if self.mode == "free" or self.model is None:
            return 0.0
        tokens = min(max(progress, 0.0), 1.0) * self.model.context_tokens
        if self.mode == "kv-migration":
            return self.gpu.link_latency_s + tokens * self.model.kv_bytes_per_token / self.gpu.link_bytes_per_s
        gpu_s = self.model.prefill_flops(tokens) / (self.gpu.flops * self.gpu.mfu)
        return gpu_s / max(gpus_per_slot, 1e-9)
