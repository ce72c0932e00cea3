"""Forward passes of the shared Llama model with a per-request KV cache.

The HF module's own layers (embeddings, norms, projections, MLP, rotary embedding) do the maths, so the
engine computes exactly what ``opengyre.models.token_logprobs`` computes for the trainer; only attention is
done here, over each request's cache: chunked prefill for one request, then one batched decode step for
all running requests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

__all__ = ["KVCache", "ModelRunner"]


@dataclass
class KVCache:
    """Keys and values of one sequence, per layer, in buffers that grow by doubling."""

    keys: list[torch.Tensor] = field(default_factory=list)  # [kv_heads, capacity, head_dim] per layer
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

    def nbytes(self) -> int:
        return sum(t.element_size() * t.numel() for t in (*self.keys, *self.values))

    def truncated_copy(self, length: int) -> KVCache:
        """The first ``length`` positions (for reuse by another request sharing the prefix)."""
        length = min(length, self.length)
        cap = 64
        while cap < length + 1:
            cap *= 2
        out = KVCache(length=length)
        for k, v in zip(self.keys, self.values, strict=True):
            nk = k.new_zeros((k.shape[0], cap, k.shape[2]))
            nv = v.new_zeros((v.shape[0], cap, v.shape[2]))
            nk[:, :length] = k[:, :length]
            nv[:, :length] = v[:, :length]
            out.keys.append(nk)
            out.values.append(nv)
        return out


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM) -> None:
        self.model = model
        cfg = model.config
        self.n_layers = int(cfg.num_hidden_layers)
        self.n_heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab_size = int(cfg.vocab_size)
        self.max_positions = int(cfg.max_position_embeddings)
        self.dtype = next(model.parameters()).dtype

    def new_cache(self) -> KVCache:
        return KVCache()

    def _reserve(self, cache: KVCache, needed: int) -> None:
        if cache.keys and cache.capacity >= needed:
            return
        cap = max(64, cache.capacity)
        while cap < needed:
            cap *= 2
        shape = (self.kv_heads, cap, self.head_dim)
        if not cache.keys:
            cache.keys = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)]
            cache.values = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)]
            return
        for i in range(self.n_layers):
            nk = torch.zeros(shape, dtype=self.dtype)
            nv = torch.zeros(shape, dtype=self.dtype)
            nk[:, : cache.length] = cache.keys[i][:, : cache.length]
            nv[:, : cache.length] = cache.values[i][:, : cache.length]
            cache.keys[i], cache.values[i] = nk, nv

    @torch.inference_mode()
    def prefill(self, cache: KVCache, ids: Sequence[int], *, all_logits: bool = False) -> torch.Tensor:
        """Run ``ids`` after what ``cache`` holds; returns logits [vocab] of the last position, or [S, vocab]."""
        m = self.model.model
        s = len(ids)
        p0 = cache.length
        self._reserve(cache, p0 + s)
        x = m.embed_tokens(torch.tensor([list(ids)], dtype=torch.long))
        pos = torch.arange(p0, p0 + s).unsqueeze(0)
        cos, sin = m.rotary_emb(x, pos)
        mask = None
        if p0 > 0:
            # Causal over the new block, full over the cached prefix.
            mask = torch.arange(p0 + s).unsqueeze(0) <= (torch.arange(s) + p0).unsqueeze(1)
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(1, s, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(1, s, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(1, s, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            cache.keys[i][:, p0 : p0 + s] = k[0]
            cache.values[i][:, p0 : p0 + s] = v[0]
            kk = cache.keys[i][:, : p0 + s].unsqueeze(0)
            vv = cache.values[i][:, : p0 + s].unsqueeze(0)
            o = F.scaled_dot_product_attention(
                q, kk, vv, attn_mask=mask, is_causal=mask is None, scale=attn.scaling, enable_gqa=True
            )
            x = x + attn.o_proj(o.transpose(1, 2).reshape(1, s, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        cache.length = p0 + s
        h = m.norm(x[0] if all_logits else x[0, -1:])
        logits: torch.Tensor = self.model.lm_head(h).float()
        return logits if all_logits else logits[0]

    @torch.inference_mode()
    def decode(self, caches: Sequence[KVCache], ids: Sequence[int]) -> torch.Tensor:
        """One token for each sequence; returns logits [B, vocab]."""
        m = self.model.model
        b = len(ids)
        for c in caches:
            self._reserve(c, c.length + 1)
        x = m.embed_tokens(torch.tensor(list(ids), dtype=torch.long).unsqueeze(1))  # [B, 1, H]
        pos = torch.tensor([c.length for c in caches], dtype=torch.long).unsqueeze(1)
        cos, sin = m.rotary_emb(x, pos)
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(b, 1, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(b, 1, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs = []
            for j, c in enumerate(caches):
                n = c.length
                c.keys[i][:, n] = k[j, :, 0]
                c.values[i][:, n] = v[j, :, 0]
                # Each sequence attends over its own cache: no padding, no copies of other sequences.
                outs.append(
                    F.scaled_dot_product_attention(
                        q[j : j + 1],
                        c.keys[i][:, : n + 1].unsqueeze(0),
                        c.values[i][:, : n + 1].unsqueeze(0),
                        scale=attn.scaling,
                        enable_gqa=True,
                    )
                )
            o = torch.cat(outs, dim=0)  # [B, heads, 1, head_dim]
            x = x + attn.o_proj(o.transpose(1, 2).reshape(b, 1, -1))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        for c in caches:
            c.length += 1
        logits: torch.Tensor = self.model.lm_head(m.norm(x[:, 0])).float()
        return logits
