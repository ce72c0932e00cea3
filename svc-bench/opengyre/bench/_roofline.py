"""Analytic roofline of a decoder-only transformer from its Hugging Face ``config.json``.

For each decoder-layer component (QKV/O projections, MLP or MoE experts, attention core, elementwise ops) and
each phase (prefill, decode) it counts FLOPs and DRAM bytes, hence operational intensity OI = FLOPs/bytes,
and places it against the hardware's ridge Ppeak/BWpeak. It also gives the capacity footprint: weights plus
the KV cache of C concurrent requests per GPU, against HBM, and the concurrency where it crosses.

Modelling conventions (stated because any roofline depends on them):
- one multiply-add is 2 FLOPs; exp, division and rsqrt count 1 FLOP each;
- DRAM bytes of a GEMM are its weights read once per step plus its input and output activations once;
  attention reads each request's K/V once (an ideal fused kernel) and writes the new tokens' K/V;
- an MoE step touches E·(1-(1-k/E)^T) distinct experts for T tokens (uniform routing);
- weights and activations are sharded evenly over tensor-parallel ranks; a KV head is never split, so with
  more ranks than KV heads each rank keeps ceil(Hkv/TP) heads;
- activations, CUDA graphs and the allocator's workspace are not in the footprint (a lower bound).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._hardware import Hardware

__all__ = [
    "COMPONENTS",
    "Capacity",
    "ComponentCost",
    "ConfigError",
    "ModelShape",
    "PhaseRoofline",
    "capacity",
    "phase_roofline",
    "roofline_report",
]

COMPONENTS = ("qkv_o", "mlp", "attention", "elementwise")


class ConfigError(ValueError):
    """A config.json the roofline cannot use: names every missing or invalid field."""


def _need(cfg: Mapping[str, Any], names: tuple[str, ...], missing: list[str]) -> int:
    for n in names:
        v = cfg.get(n)
        if v is not None:
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ConfigError(f"config field {n!r} must be a positive integer, got {v!r}")
            return v
    missing.append(" or ".join(names))
    return 0


@dataclass(frozen=True)
class ModelShape:
    """What the roofline needs of a model, read from its config (GQA: ``kv_heads`` is num_key_value_heads)."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # dense MLP width
    vocab: int
    tie_embeddings: bool = False
    experts: int = 0  # 0: dense
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_expert_intermediate: int = 0
    moe_layers: frozenset[int] = field(default_factory=frozenset)
    windows: tuple[int | None, ...] = ()  # per layer: sliding window or None (full attention)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], name: str = "model") -> ModelShape:
        """Read a HF config (a ``text_config`` inside a multimodal one is used when present)."""
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"config must be a JSON object, got {type(cfg).__name__}")
        if isinstance(cfg.get("text_config"), Mapping):
            cfg = cfg["text_config"]
        missing: list[str] = []
        hidden = _need(cfg, ("hidden_size",), missing)
        layers = _need(cfg, ("num_hidden_layers",), missing)
        heads = _need(cfg, ("num_attention_heads",), missing)
        kv_heads = _need(cfg, ("num_key_value_heads",), missing)
        vocab = _need(cfg, ("vocab_size",), missing)
        n_experts = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
        moe = isinstance(n_experts, int) and n_experts > 0
        if moe:
            k = _need(cfg, ("num_experts_per_tok", "experts_per_token"), missing)
            e_inter = _need(cfg, ("moe_intermediate_size", "intermediate_size"), missing)
        else:
            k = e_inter = 0
        dense_needed = not moe or bool(cfg.get("mlp_only_layers")) or int(cfg.get("decoder_sparse_step", 1) or 1) > 1
        inter = _need(cfg, ("intermediate_size",), missing) if dense_needed else 0
        if missing:
            raise ConfigError(f"config {name!r} is missing: {', '.join(missing)}")
        hd = cfg.get("head_dim")
        if hd is None:
            if hidden % heads:
                raise ConfigError(f"config {name!r}: no head_dim and hidden_size {hidden} not divisible by heads")
            hd = hidden // heads  # HF's definition when the field is absent
        if heads % kv_heads:
            raise ConfigError(f"config {name!r}: num_attention_heads {heads} not a multiple of KV heads {kv_heads}")
        moe_layers: frozenset[int] = frozenset()
        if moe:
            step = int(cfg.get("decoder_sparse_step", 1) or 1)
            dense_only = set(cfg.get("mlp_only_layers") or ())
            moe_layers = frozenset(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
        windows: list[int | None] = [None] * layers
        types = cfg.get("layer_types")
        if types is not None:
            if not isinstance(types, list) or len(types) != layers:
                raise ConfigError(f"config {name!r}: layer_types must list {layers} entries")
            if "sliding_attention" in types:
                w = cfg.get("sliding_window")
                if not isinstance(w, int) or w <= 0:
                    raise ConfigError(f"config {name!r}: sliding_attention layers but no sliding_window")
                windows = [w if t == "sliding_attention" else None for t in types]
        return cls(
            name=name,
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=int(hd),
            intermediate=inter,
            vocab=vocab,
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            experts=int(n_experts) if moe else 0,
            experts_per_token=k,
            expert_intermediate=e_inter,
            shared_expert_intermediate=int(cfg.get("shared_expert_intermediate_size") or 0),
            moe_layers=moe_layers,
            windows=tuple(windows),
        )

    # --- parameter and KV counts ---------------------------------------------------------------------

    @property
    def attn_params(self) -> int:
        return self.hidden * self.head_dim * (2 * self.heads + 2 * self.kv_heads)

    def mlp_params(self, layer: int) -> int:
        if layer in self.moe_layers:
            return (
                self.experts * 3 * self.hidden * self.expert_intermediate
                + self.hidden * self.experts
                + 3 * self.hidden * self.shared_expert_intermediate
            )
        return 3 * self.hidden * self.intermediate

    @property
    def params(self) -> int:
        per_layers = sum(self.attn_params + self.mlp_params(i) + 2 * self.hidden for i in range(self.layers))
        embed = self.vocab * self.hidden * (1 if self.tie_embeddings else 2)
        return per_layers + embed + self.hidden

    def kv_bytes(self, context: int, kv_bytes: float = 2.0) -> float:
        """KV cache bytes of one request holding ``context`` tokens (sliding layers keep at most the window)."""
        per_tok_layer = 2 * self.kv_heads * self.head_dim * kv_bytes
        return sum(per_tok_layer * (context if w is None else min(context, w)) for w in self.windows)


@dataclass(frozen=True)
class ComponentCost:
    flops: float
    bytes: float

    @property
    def oi(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf

    def __add__(self, other: ComponentCost) -> ComponentCost:
        return ComponentCost(self.flops + other.flops, self.bytes + other.bytes)

    def time_s(self, hw: Hardware) -> float:
        """Roofline time: the larger of compute time and memory time."""
        return max(self.flops / hw.peak_flops, self.bytes / hw.hbm_bandwidth)


def _span_sum(p: int, q: int, w: int | None) -> int:
    """Σ over new positions j = p+1..p+q of the keys each attends to: min(j, w) (causal, sliding window w)."""
    hi = p + q
    if w is None or hi <= w:
        return q * p + q * (q + 1) // 2
    lo = p + 1
    below = max(0, min(hi, w) - lo + 1)  # positions < = w
    s_below = (lo + lo + below - 1) * below // 2 if below else 0
    return s_below + (q - below) * w


def _layer(
    s: ModelShape, layer: int, requests: int, q: int, p: int, wb: float, ab: float, kb: float
) -> dict[str, ComponentCost]:
    h, d, hq, hk = s.hidden, s.head_dim, s.heads, s.kv_heads
    t = requests * q  # tokens in this step
    qkv_out = (hq + 2 * hk) * d
    qkv_o = ComponentCost(
        2 * t * h * qkv_out + 2 * t * hq * d * h,
        s.attn_params * wb + t * (h + qkv_out + hq * d + h) * ab,
    )
    if layer in s.moe_layers:
        e, k, ie = s.experts, s.experts_per_token, s.expert_intermediate
        touched = e * (1 - (1 - k / e) ** t)
        si = s.shared_expert_intermediate
        mlp = ComponentCost(
            2 * t * h * e + 2 * t * k * 3 * h * ie + 2 * t * 3 * h * si,
            (touched * 3 * h * ie + h * e + 3 * h * si) * wb
            + (t * h + t * e + t * k * (3 * ie + h) + t * 3 * si + t * h) * ab,
        )
        act_width = k * ie + si
    else:
        i = s.intermediate
        mlp = ComponentCost(2 * t * 3 * h * i, 3 * h * i * wb + t * (h + 3 * i + h) * ab)
        act_width = i
    w = s.windows[layer] if s.windows else None
    spans = requests * _span_sum(p, q, w)
    keys_read = p + q if w is None else min(p + q, w + q - 1)
    attention = ComponentCost(
        4 * hq * d * spans + 5 * hq * spans,  # QK^T and PV, plus softmax per score
        requests * (2 * hk * d * (keys_read + q) * kb + 2 * q * hq * d * ab),
    )
    elementwise = ComponentCost(
        2 * 4 * t * h + 3 * t * (hq + hk) * d + 5 * t * act_width + 2 * t * h,  # 2 RMSNorm, RoPE, SiLU·mul, 2 adds
        (2 * 2 * t * h + 2 * t * (hq + hk) * d + 3 * t * act_width + 2 * 3 * t * h) * ab + 2 * h * wb,
    )
    return {"qkv_o": qkv_o, "mlp": mlp, "attention": attention, "elementwise": elementwise}


@dataclass(frozen=True)
class PhaseRoofline:
    """One phase step over all layers: per component totals, against one hardware's ridge."""

    phase: str
    requests: int
    new_tokens: int  # per request in this step
    context: int  # tokens already cached per request
    hardware: Hardware
    components: dict[str, ComponentCost]
    lm_head: ComponentCost

    @property
    def total(self) -> ComponentCost:
        tot = self.lm_head
        for c in self.components.values():
            tot = tot + c
        return tot

    def bound(self, name: str) -> str:
        return "compute" if self.components[name].oi >= self.hardware.ridge else "memory"

    def time_shares(self) -> dict[str, float]:
        """Each component's share of the modelled layer time (roofline time, summed over layers)."""
        times = {n: c.time_s(self.hardware) for n, c in self.components.items()}
        tot = sum(times.values())
        return {n: t / tot for n, t in times.items()}

    def to_dict(self) -> dict[str, Any]:
        shares = self.time_shares()
        return {
            "phase": self.phase,
            "requests": self.requests,
            "new_tokens": self.new_tokens,
            "context": self.context,
            "hardware": self.hardware.name,
            "ridge": self.hardware.ridge,
            "components": {
                n: {
                    "flops": c.flops,
                    "bytes": c.bytes,
                    "oi": c.oi,
                    "bound": self.bound(n),
                    "time_s": c.time_s(self.hardware),
                    "time_share": shares[n],
                }
                for n, c in self.components.items()
            },
            "total": {"flops": self.total.flops, "bytes": self.total.bytes, "oi": self.total.oi},
        }


def phase_roofline(
    shape: ModelShape,
    hw: Hardware,
    phase: str,
    *,
    requests: int,
    new_tokens: int,
    context: int,
    weight_bytes: float = 2.0,
    act_bytes: float = 2.0,
    kv_bytes: float = 2.0,
) -> PhaseRoofline:
    """FLOPs and bytes of one step where each of ``requests`` requests adds ``new_tokens`` after ``context``.

    Prefill of a fresh prompt of n tokens: ``new_tokens=n, context=0``; a decode step at context L:
    ``new_tokens=1, context=L``. Sums over all decoder layers; the LM head (logits for one token per
    request, as servers compute in prefill too) is kept apart.
    """
    if phase not in ("prefill", "decode"):
        raise ValueError(f"phase must be prefill or decode, got {phase!r}")
    for label, v in (("requests", requests), ("new_tokens", new_tokens)):
        if v <= 0:
            raise ValueError(f"{label} must be positive, got {v}")
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    comps = {n: ComponentCost(0.0, 0.0) for n in COMPONENTS}
    for layer in range(shape.layers):
        for n, c in _layer(shape, layer, requests, new_tokens, context, weight_bytes, act_bytes, kv_bytes).items():
            comps[n] = comps[n] + c
    lm = ComponentCost(
        2 * requests * shape.hidden * shape.vocab,
        shape.hidden * shape.vocab * weight_bytes + requests * (shape.hidden + shape.vocab) * act_bytes,
    )
    return PhaseRoofline(phase, requests, new_tokens, context, hw, comps, lm)


@dataclass(frozen=True)
class Capacity:
    """Per-GPU memory of a tensor-parallel replica serving requests of ``context`` tokens each."""

    hardware: Hardware
    tp: int
    memory_utilisation: float
    context: int
    weights_per_gpu: float
    kv_per_request_per_gpu: float

    @property
    def budget(self) -> float:
        return self.hardware.hbm_capacity * self.memory_utilisation

    def footprint(self, concurrency: int) -> float:
        """Bytes per GPU with ``concurrency`` requests resident."""
        return self.weights_per_gpu + concurrency * self.kv_per_request_per_gpu

    @property
    def max_concurrency(self) -> int:
        """The most requests that fit; 0 when the weights alone do not fit (the wall is at C=1)."""
        free = self.budget - self.weights_per_gpu
        if free < 0:
            return 0
        return int(free // self.kv_per_request_per_gpu) if self.kv_per_request_per_gpu else 1 << 62

    @property
    def wall(self) -> int:
        """The concurrency at which the footprint first crosses the memory budget."""
        return self.max_concurrency + 1

    def to_dict(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware.name,
            "tp": self.tp,
            "memory_utilisation": self.memory_utilisation,
            "context": self.context,
            "budget_bytes": self.budget,
            "weights_per_gpu_bytes": self.weights_per_gpu,
            "kv_per_request_per_gpu_bytes": self.kv_per_request_per_gpu,
            "max_concurrency": self.max_concurrency,
            "wall_concurrency": self.wall,
        }


def _check_tp(shape: ModelShape, tp: int) -> None:
    """Refuse a tensor-parallel degree no serving system runs: attention heads split evenly, and KV heads either
    split evenly (``tp`` divides them) or replicated (``tp`` a multiple of them; vLLM and SGLang refuse the
    rest). An uneven split would have to be modelled as padding no real engine does."""
    if shape.heads % tp:
        raise ValueError(
            f"a tensor-parallel degree of {tp} does not divide the {shape.heads} attention heads of {shape.name};"
            f" use a divisor of {shape.heads}"
        )
    kv = shape.kv_heads
    if (tp <= kv and kv % tp) or (tp > kv and tp % kv):
        raise ValueError(
            f"a tensor-parallel degree of {tp} cannot shard the {kv} KV heads of {shape.name}: it must divide them"
            f" or be a multiple of them (each rank then holds a replica of one KV head)"
        )


def capacity(
    shape: ModelShape,
    hw: Hardware,
    *,
    context: int,
    tp: int = 1,
    memory_utilisation: float = 1.0,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
) -> Capacity:
    if tp <= 0:
        raise ValueError(f"tp must be positive, got {tp}")
    if not 0 < memory_utilisation <= 1:
        raise ValueError(f"memory_utilisation must be in (0, 1], got {memory_utilisation}")
    if context <= 0:
        raise ValueError(f"context must be positive, got {context}")
    _check_tp(shape, tp)
    # Past the KV heads each rank holds a replica of one (vLLM's and SGLang's rule), never a fraction of one.
    kv_share = math.ceil(shape.kv_heads / tp) / shape.kv_heads
    return Capacity(
        hw,
        tp,
        memory_utilisation,
        context,
        shape.params * weight_bytes / tp,
        shape.kv_bytes(context, kv_bytes) * kv_share,
    )


def roofline_report(
    shape: ModelShape,
    hw: Hardware,
    *,
    isl: int,
    osl: int,
    batch: int = 1,
    tp: int = 1,
    memory_utilisation: float = 1.0,
    weight_bytes: float = 2.0,
    kv_bytes: float = 2.0,
) -> dict[str, Any]:
    """Prefill of one ``isl``-token prompt, a decode step of ``batch`` requests midway through their ``osl``
    tokens, and the capacity footprint of requests holding ``isl + osl`` tokens: the figures as one document."""
    kw = {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes}
    prefill = phase_roofline(shape, hw, "prefill", requests=1, new_tokens=isl, context=0, act_bytes=2.0, **kw)
    decode = phase_roofline(shape, hw, "decode", requests=batch, new_tokens=1, context=isl + osl // 2, **kw)
    cap = capacity(shape, hw, context=isl + osl, tp=tp, memory_utilisation=memory_utilisation, **kw)
    p_gemm = prefill.components["qkv_o"] + prefill.components["mlp"]
    d_gemm = decode.components["qkv_o"] + decode.components["mlp"]
    return {
        "model": shape.name,
        "params": shape.params,
        "hardware": {
            "name": hw.name,
            "peak_flops": hw.peak_flops,
            "hbm_bandwidth": hw.hbm_bandwidth,
            "hbm_capacity": hw.hbm_capacity,
            "ridge": hw.ridge,
            "source": hw.source,
        },
        "isl": isl,
        "osl": osl,
        "batch": batch,
        "prefill": prefill.to_dict(),
        "decode": decode.to_dict(),
        "projection_oi": {"prefill": p_gemm.oi, "decode": d_gemm.oi, "ratio": p_gemm.oi / d_gemm.oi},
        "capacity": cap.to_dict(),
    }
