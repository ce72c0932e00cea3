"""Hugging Face Llama <-> megatron-core GPTModel weight layouts, with tensor-parallel sharding.

megatron fuses q, k and v into ``linear_qkv`` laid out per query group ([q heads of the group | k | v] for
each group), and gate and up into ``linear_fc1`` ([gate | up]). Column-parallel weights (qkv, fc1, output,
the vocab-parallel embedding) split along dim 0, row-parallel ones (proj, fc2) along dim 1, norms replicate.
Gradients use the same maps, so a satellite's or another backend's gradients can be added in either naming.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from transformers import LlamaConfig

__all__ = ["from_stage", "hf_to_mcore", "mcore_to_hf", "shard_dim", "stage_layers", "to_stage", "unshard"]


def _dims(cfg: LlamaConfig) -> tuple[int, int, int, int]:
    heads = int(cfg.num_attention_heads)
    groups = int(cfg.num_key_value_heads or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return heads, groups, head_dim, int(cfg.hidden_size)


def _tied(cfg: LlamaConfig) -> bool:
    return bool(getattr(cfg, "tie_word_embeddings", False))


def shard_dim(mcore_name: str) -> int | None:
    """The dimension a megatron parameter is split along under tensor parallelism (None: replicated)."""
    if mcore_name.endswith(("linear_qkv.weight", "linear_fc1.weight", "output_layer.weight", "word_embeddings.weight")):
        return 0
    if mcore_name.endswith(("linear_proj.weight", "linear_fc2.weight")):
        return 1
    return None


def _split(name: str, full: torch.Tensor, rank: int, size: int, fc1_halves: bool) -> torch.Tensor:
    dim = shard_dim(name)
    if dim is None or size == 1:
        return full
    if fc1_halves and name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(size, 0)[rank], up.chunk(size, 0)[rank]], dim=0)
    return full.chunk(size, dim=dim)[rank].contiguous()


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of the tensor-parallel split of one megatron parameter."""
    dim = shard_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([torch.cat([h[0] for h in halves]), torch.cat([h[1] for h in halves])], dim=0)
    return torch.cat(shards, dim=dim)


def hf_to_mcore(
    sd: Mapping[str, torch.Tensor], cfg: LlamaConfig, tp_rank: int = 0, tp_size: int = 1
) -> dict[str, torch.Tensor]:
    heads, groups, d, hidden = _dims(cfg)
    out: dict[str, torch.Tensor] = {
        "embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
        "decoder.final_layernorm.weight": sd["model.norm.weight"],
    }
    if not _tied(cfg):  # tied: megatron's output layer is the embedding (share_embeddings_and_output_weights)
        out["output_layer.weight"] = sd["lm_head.weight"]
    for i in range(cfg.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"decoder.layers.{i}."
        wq = sd[p + "self_attn.q_proj.weight"].reshape(groups, heads // groups * d, hidden)
        wk = sd[p + "self_attn.k_proj.weight"].reshape(groups, d, hidden)
        wv = sd[p + "self_attn.v_proj.weight"].reshape(groups, d, hidden)
        out[q + "self_attention.linear_qkv.weight"] = torch.cat([wq, wk, wv], dim=1).reshape(-1, hidden)
        out[q + "self_attention.linear_proj.weight"] = sd[p + "self_attn.o_proj.weight"]
        out[q + "input_layernorm.weight"] = sd[p + "input_layernorm.weight"]
        out[q + "pre_mlp_layernorm.weight"] = sd[p + "post_attention_layernorm.weight"]
        out[q + "mlp.linear_fc1.weight"] = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        out[q + "mlp.linear_fc2.weight"] = sd[p + "mlp.down_proj.weight"]
    return {k: _split(k, v, tp_rank, tp_size, fc1_halves=True).clone() for k, v in out.items()}


def mcore_to_hf(sd: Mapping[str, torch.Tensor], cfg: LlamaConfig) -> dict[str, torch.Tensor]:
    """From a full (unsharded) megatron state dict."""
    heads, groups, d, hidden = _dims(cfg)
    hq = heads // groups * d
    out: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": sd["embedding.word_embeddings.weight"],
        "model.norm.weight": sd["decoder.final_layernorm.weight"],
    }
    if not _tied(cfg):  # tied: the output layer is the embedding, stored once (as opengyre.models.model_state)
        out["lm_head.weight"] = sd["output_layer.weight"]
    for i in range(cfg.num_hidden_layers):
        p, q = f"model.layers.{i}.", f"decoder.layers.{i}."
        qkv = sd[q + "self_attention.linear_qkv.weight"].reshape(groups, hq + 2 * d, hidden)
        out[p + "self_attn.q_proj.weight"] = qkv[:, :hq].reshape(-1, hidden)
        out[p + "self_attn.k_proj.weight"] = qkv[:, hq : hq + d].reshape(-1, hidden)
        out[p + "self_attn.v_proj.weight"] = qkv[:, hq + d :].reshape(-1, hidden)
        out[p + "self_attn.o_proj.weight"] = sd[q + "self_attention.linear_proj.weight"]
        out[p + "input_layernorm.weight"] = sd[q + "input_layernorm.weight"]
        out[p + "post_attention_layernorm.weight"] = sd[q + "pre_mlp_layernorm.weight"]
        gate, up = sd[q + "mlp.linear_fc1.weight"].chunk(2, dim=0)
        out[p + "mlp.gate_proj.weight"] = gate
        out[p + "mlp.up_proj.weight"] = up
        out[p + "mlp.down_proj.weight"] = sd[q + "mlp.linear_fc2.weight"]
    return {k: v.detach().clone().contiguous() for k, v in out.items()}


def stage_layers(cfg: LlamaConfig, pp_rank: int, pp_size: int) -> range:
    """The global layer indices a pipeline stage holds (an even split, as megatron's default)."""
    n = int(cfg.num_hidden_layers)
    if n % pp_size:
        raise ValueError(f"{n} layers do not split evenly over {pp_size} pipeline stages")
    per = n // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def to_stage(full: Mapping[str, torch.Tensor], cfg: LlamaConfig, pp_rank: int, pp_size: int) -> dict[str, torch.Tensor]:
    """The part of a (TP-local) megatron state dict one pipeline stage owns, with stage-local layer indices."""
    layers = stage_layers(cfg, pp_rank, pp_size)
    out: dict[str, torch.Tensor] = {}
    for k, v in full.items():
        if k.startswith("decoder.layers."):
            i, rest = k[len("decoder.layers.") :].split(".", 1)
            if int(i) in layers:
                out[f"decoder.layers.{int(i) - layers.start}.{rest}"] = v
        elif k.startswith("embedding."):
            if pp_rank == 0:
                out[k] = v
        elif pp_rank == pp_size - 1:  # final norm and output layer
            out[k] = v
    return out


def from_stage(
    local: Mapping[str, torch.Tensor], cfg: LlamaConfig, pp_rank: int, pp_size: int
) -> dict[str, torch.Tensor]:
    """Inverse of ``to_stage``: global layer indices again."""
    start = stage_layers(cfg, pp_rank, pp_size).start
    out: dict[str, torch.Tensor] = {}
    for k, v in local.items():
        if k.startswith("decoder.layers."):
            i, rest = k[len("decoder.layers.") :].split(".", 1)
            out[f"decoder.layers.{int(i) + start}.{rest}"] = v
        else:
            out[k] = v
    return out
