"""Forward passes of the shared Llama model with a per-request KV cache.

The HF module's own layers (embeddings, norms, rotary embedding, activation) do the maths, so the engine
computes what ``opengyre.models.token_logprobs`` computes for the trainer; only attention is done here, over each
request's cache: chunked prefill for one request, then one batched decode step for all running requests.

Two kernels for the projections (registry ``PROJECTIONS``):

- ``exact``: the modules' own ``nn.Linear`` (MKL's sgemm on x86), the trainer's kernel: prompt logprobs
  (``all_logits=True``) always take it, so they equal the trainer's bit for bit;
- ``onednn``: the same float32 weights laid out once for oneDNN's GEMM (QKV and gate/up fused). On CPUs where
  MKL's sgemm runs a generic path (AMD: half oneDNN's speed on the development machine's EPYC) generation is
  bound by these GEMMs, so this is where its time goes. Results differ from ``exact`` by float summation
  order only (~1e-6 per projection), like the KV-cached path already does;
- ``onednn-bf16``: the decoder layers' projections in bfloat16 (``Bf16Projections``), the rollout precision of
  GPU RL engines; opt-in (``EngineConfig.projections``), its mismatch with the trainer measured.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F  # noqa: N812 (the conventional name)
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

__all__ = ["PROJECTIONS", "Bf16Projections", "KVCache", "ModelRunner", "OneDnnProjections", "Projections"]


@dataclass
class KVCache:
    """Keys and values of one sequence, per layer, in buffers that grow by doubling."""

    keys: list[torch.Tensor] = field(default_factory=list)  # [kv_heads, capacity, head_dim] per layer
    values: list[torch.Tensor] = field(default_factory=list)
    length: int = 0
    slot: int | None = None  # while it is being decoded: its row in the runner's KVPool (keys are views into it)

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1] if self.keys else 0

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


class KVPool:
    """The KV of the sequences being decoded, side by side: per layer [slots, kv_heads, capacity, head_dim].

    A member's ``KVCache`` holds views of its row, so one decode step writes every member's new key and value
    with one indexed copy and attends for all of them in one SDPA call (masked to each one's length) instead of
    one call per sequence per layer. Rows are kept dense (a leaving member's row is taken by the last one);
    the capacity doubles as the longest member grows and the buffers are freed when the pool empties."""

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        self.n_layers, self.kv_heads, self.head_dim, self.dtype = n_layers, kv_heads, head_dim, dtype
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.members: list[KVCache] = []

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0] if self.keys else 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2] if self.keys else 0

    def _grow(self, slots: int, capacity: int) -> None:
        if self.keys and self.slots >= slots and self.capacity >= capacity:
            return
        s, cap = max(8, self.slots), max(64, self.capacity)
        while s < slots:
            s *= 2
        while cap < capacity:
            cap *= 2
        shape = (s, self.kv_heads, cap, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)]
        values = [torch.zeros(shape, dtype=self.dtype) for _ in range(self.n_layers)]
        n = len(self.members)
        if n:
            top = max(c.length for c in self.members)
            for i in range(self.n_layers):
                keys[i][:n, :, :top] = self.keys[i][:n, :, :top]
                values[i][:n, :, :top] = self.values[i][:n, :, :top]
        self.keys, self.values = keys, values
        for c in self.members:
            self._point(c)

    def _point(self, c: KVCache) -> None:
        assert c.slot is not None
        c.keys = [k[c.slot] for k in self.keys]
        c.values = [v[c.slot] for v in self.values]

    def sync(self, caches: Sequence[KVCache], needed: int) -> None:
        """Make the members exactly ``caches``, with room for ``needed`` positions each."""
        wanted = {id(c) for c in caches}
        for c in [m for m in self.members if id(m) not in wanted]:
            self.leave(c, keep=True)
        joining = [c for c in caches if c.slot is None]
        self._grow(len(self.members) + len(joining), needed)
        for c in joining:
            c.slot = len(self.members)
            self.members.append(c)
            n = c.length
            for i in range(self.n_layers):
                if n:
                    self.keys[i][c.slot, :, :n] = c.keys[i][:, :n]
                    self.values[i][c.slot, :, :n] = c.values[i][:, :n]
            self._point(c)

    def leave(self, c: KVCache, *, keep: bool) -> None:
        """Take ``c`` out of the pool; ``keep``: it gets its own copy of its keys and values (else it is emptied)."""
        if c.slot is None:
            return
        slot, n = c.slot, c.length
        if keep:
            own = c.truncated_copy(n)
            c.keys, c.values = own.keys, own.values
        else:
            c.keys, c.values, c.length = [], [], 0
        c.slot = None
        last = self.members.pop()
        if last is not c:  # the last row moves into the hole
            self.members[slot] = last
            m = last.length
            for i in range(self.n_layers):
                self.keys[i][slot, :, :m] = self.keys[i][last.slot, :, :m]
                self.values[i][slot, :, :m] = self.values[i][last.slot, :, :m]
            last.slot = slot
            self._point(last)
        if not self.members:
            self.keys, self.values = [], []


Linear = Callable[[torch.Tensor], torch.Tensor]  # x [n, in] -> [n, out]


class Projections:
    """The model's projections over 2-D activations [n, hidden]: the modules' own (the trainer's kernels)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        self.layers = list(model.model.layers)
        self.head: Linear = model.lm_head

    def qkv(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attn = self.layers[i].self_attn
        return attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)

    def o(self, i: int, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers[i].self_attn.o_proj(x)
        return out

    def mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers[i].mlp(h)
        return out

    def lm_head(self, h: torch.Tensor) -> torch.Tensor:
        return self.head(h)


class OneDnnProjections(Projections):
    """The same float32 weights, laid out once for oneDNN's GEMM, QKV and gate/up fused into one GEMM each.

    A copy of the weights: rebuild it after loading new weights into the model."""

    layer_dtype = torch.float32  # the decoder layers' GEMMs; the LM head is always float32

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__(model)
        dt = self.layer_dtype
        self._qkv = [
            _packed(ly.self_attn.q_proj, ly.self_attn.k_proj, ly.self_attn.v_proj, dtype=dt) for ly in self.layers
        ]
        self._o = [_packed(ly.self_attn.o_proj, dtype=dt) for ly in self.layers]
        self._gate_up = [_packed(ly.mlp.gate_proj, ly.mlp.up_proj, dtype=dt) for ly in self.layers]
        self._down = [_packed(ly.mlp.down_proj, dtype=dt) for ly in self.layers]
        self.head = _packed(model.lm_head)
        attn = self.layers[0].self_attn
        self._splits = (int(attn.q_proj.out_features), int(attn.k_proj.out_features))

    def qkv(self, i: int, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out = self._qkv[i](h)
        nq, nk = self._splits
        return out[:, :nq], out[:, nq : nq + nk], out[:, nq + nk :]

    def o(self, i: int, x: torch.Tensor) -> torch.Tensor:
        return self._o[i](x)

    def mlp(self, i: int, h: torch.Tensor) -> torch.Tensor:
        gate, up = self._gate_up[i](h).chunk(2, dim=-1)
        return self._down[i](self.layers[i].mlp.act_fn(gate.contiguous()) * up)


class Bf16Projections(OneDnnProjections):
    """The decoder layers' projections in bfloat16 on oneDNN (AVX-512 BF16 / AMX where the CPU has them), the
    precision RL rollout engines serve in (SGLang and vLLM serve bf16 while trainers compute in their own): the
    float32 activations are rounded to bf16 for each GEMM, which accumulates in float32, and its output comes back
    as float32 into the float32 residual stream, norms and attention. The LM head stays float32: a bf16 logit of
    ~20 is off by up to 0.06, a logprob error nothing downstream should absorb. What this changes against the
    trainer is measured, not assumed (``svc-proxy/bench/engine_vs_hf.py --projections onednn-bf16``: per-token KL
    and the importance ratio's spread), and the behaviour logprobs recorded are this engine's, as with any
    engine, for the trainer's importance sampling to correct."""

    layer_dtype = torch.bfloat16


def _packed(*mods: torch.nn.Linear, dtype: torch.dtype = torch.float32) -> Linear:
    """One oneDNN GEMM computing ``mods`` side by side (their outputs concatenated); with ``dtype`` bfloat16 on
    weights and inputs rounded to it, the output back in float32."""
    biases = [m.bias for m in mods if m.bias is not None]
    if biases and len(biases) < len(mods):  # some with a bias, some without: no fused form
        return lambda x: torch.cat([m(x) for m in mods], dim=-1)
    with torch.inference_mode():
        w = torch.cat([m.weight.detach() for m in mods]).to(dtype).contiguous()
        b = torch.cat([x.detach() for x in biases]).to(dtype) if biases else None
        pw = torch.ops.mkldnn._reorder_linear_weight(w)
    pointwise = torch.ops.mkldnn._linear_pointwise.default
    if dtype == torch.float32:

        def f(x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = pointwise(x, pw, b, "none", [], "")
            return out

        return f

    def low(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = pointwise(x.to(dtype), pw, b, "none", [], "").float()
        return out

    return low


def _onednn(model: LlamaForCausalLM) -> Projections:
    if not torch._C._has_mkldnn or next(model.parameters()).dtype != torch.float32:
        return Projections(model)  # oneDNN's float32 GEMM only; anything else keeps the modules' own
    return OneDnnProjections(model)


def _onednn_bf16(model: LlamaForCausalLM) -> Projections:
    if not torch._C._has_mkldnn or next(model.parameters()).dtype != torch.float32:
        raise ValueError("the onednn-bf16 projections need oneDNN and a float32 model")
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("this CPU has no bfloat16 GEMM in oneDNN (AVX-512 BF16 or AMX): use onednn")
    return Bf16Projections(model)


# How the projections of generation (prefill without prompt logprobs, decode) are computed, by name.
PROJECTIONS: dict[str, Callable[[LlamaForCausalLM], Projections]] = {
    "exact": Projections,
    "onednn": _onednn,
    "onednn-bf16": _onednn_bf16,
}


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, projections: str = "onednn") -> None:
        if projections not in PROJECTIONS:
            raise ValueError(f"unknown projection kernel {projections!r}: one of {', '.join(PROJECTIONS)}")
        self.model = model
        cfg = model.config
        self.n_layers = int(cfg.num_hidden_layers)
        self.n_heads = int(cfg.num_attention_heads)
        self.kv_heads = int(cfg.num_key_value_heads or cfg.num_attention_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.vocab_size = int(cfg.vocab_size)
        self.max_positions = int(cfg.max_position_embeddings)
        self.dtype = next(model.parameters()).dtype
        self.projections = projections
        self.exact = Projections(model)  # the trainer's kernels, on the live weights (nothing to rebuild)
        self.fast = PROJECTIONS[projections](model)
        self.pool = KVPool(self.n_layers, self.kv_heads, self.head_dim, self.dtype)

    def weights_changed(self) -> None:
        """Rebuild what was derived from the weights (call after loading new weights into the model in place)."""
        self.fast = PROJECTIONS[self.projections](self.model)

    def new_cache(self) -> KVCache:
        return KVCache()

    @torch.inference_mode()  # the pool's buffers are inference tensors
    def release(self, cache: KVCache, *, keep: bool) -> None:
        """``cache`` will not be decoded further; ``keep``: its keys and values stay readable (prefix reuse)."""
        self.pool.leave(cache, keep=keep)

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

    def _heads(self, proj: Projections, i: int, h: torch.Tensor, b: int, s: int) -> list[torch.Tensor]:
        """q [b, heads, s, d], k and v [b, kv_heads, s, d] from activations [b*s, hidden]."""
        return [
            t.reshape(b, s, n, self.head_dim).transpose(1, 2)
            for t, n in zip(proj.qkv(i, h), (self.n_heads, self.kv_heads, self.kv_heads), strict=True)
        ]

    @torch.inference_mode()
    def prefill(self, cache: KVCache, ids: Sequence[int], *, all_logits: bool = False) -> torch.Tensor:
        """Run ``ids`` after what ``cache`` holds; returns logits [vocab] of the last position, or [S, vocab].

        ``all_logits`` (prompt logprobs) runs the trainer's own kernels, as the trainer shapes it (one sequence):
        those logprobs equal the trainer's bit for bit."""
        if not all_logits:
            return self.prefill_many([cache], [ids])[0]
        m = self.model.model
        proj = self.exact
        self.pool.leave(cache, keep=True)  # a decoded sequence continued by a prompt (not the scheduler's order)
        s = len(ids)
        p0 = cache.length
        self._reserve(cache, p0 + s)
        x = m.embed_tokens(torch.tensor(list(ids), dtype=torch.long))  # [S, H]
        pos = torch.arange(p0, p0 + s).unsqueeze(0)
        cos, sin = m.rotary_emb(x, pos)
        mask = None
        if p0 > 0:
            # Causal over the new block, full over the cached prefix.
            mask = torch.arange(p0 + s).unsqueeze(0) <= (torch.arange(s) + p0).unsqueeze(1)
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            q, k, v = self._heads(proj, i, layer.input_layernorm(x), 1, s)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            cache.keys[i][:, p0 : p0 + s] = k[0]
            cache.values[i][:, p0 : p0 + s] = v[0]
            kk = cache.keys[i][:, : p0 + s].unsqueeze(0)
            vv = cache.values[i][:, : p0 + s].unsqueeze(0)
            o = F.scaled_dot_product_attention(
                q, kk, vv, attn_mask=mask, is_causal=mask is None, scale=attn.scaling, enable_gqa=True
            )
            x = x + proj.o(i, o[0].transpose(0, 1).reshape(s, -1))
            x = x + proj.mlp(i, layer.post_attention_layernorm(x))
        cache.length = p0 + s
        logits: torch.Tensor = proj.lm_head(m.norm(x)).float()
        return logits

    @torch.inference_mode()
    def prefill_many(self, caches: Sequence[KVCache], chunks: Sequence[Sequence[int]]) -> torch.Tensor:
        """Run each chunk after what its cache holds, all in one forward pass (the projections over every token
        at once, attention per sequence); returns the logits of each chunk's last position [len(chunks), vocab]."""
        m = self.model.model
        proj = self.fast
        sizes = [len(c) for c in chunks]
        total = sum(sizes)
        starts = []
        for cache, s in zip(caches, sizes, strict=True):
            self.pool.leave(cache, keep=True)  # a decoded sequence continued by a prompt (not the scheduler's order)
            self._reserve(cache, cache.length + s)
            starts.append(cache.length)
        x = m.embed_tokens(torch.tensor([t for c in chunks for t in c], dtype=torch.long))  # [T, H]
        pos = torch.cat([torch.arange(p0, p0 + s) for p0, s in zip(starts, sizes, strict=True)]).unsqueeze(0)
        cos, sin = m.rotary_emb(x, pos)
        masks = [
            # Causal over the new block, full over the cached prefix.
            None if p0 == 0 else torch.arange(p0 + s).unsqueeze(0) <= (torch.arange(s) + p0).unsqueeze(1)
            for p0, s in zip(starts, sizes, strict=True)
        ]
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            q, k, v = self._heads(proj, i, layer.input_layernorm(x), 1, total)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            outs, at = [], 0
            for cache, p0, s, mask in zip(caches, starts, sizes, masks, strict=True):
                cache.keys[i][:, p0 : p0 + s] = k[0, :, at : at + s]
                cache.values[i][:, p0 : p0 + s] = v[0, :, at : at + s]
                outs.append(
                    F.scaled_dot_product_attention(
                        q[:, :, at : at + s],
                        cache.keys[i][:, : p0 + s].unsqueeze(0),
                        cache.values[i][:, : p0 + s].unsqueeze(0),
                        attn_mask=mask,
                        is_causal=mask is None,
                        scale=attn.scaling,
                        enable_gqa=True,
                    )
                )
                at += s
            o = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # [1, heads, T, head_dim]
            x = x + proj.o(i, o[0].transpose(0, 1).reshape(total, -1))
            x = x + proj.mlp(i, layer.post_attention_layernorm(x))
        for cache, s in zip(caches, sizes, strict=True):
            cache.length += s
        ends = torch.tensor(sizes).cumsum(0) - 1
        logits: torch.Tensor = proj.lm_head(m.norm(x[ends])).float()
        return logits

    @torch.inference_mode()
    def decode(self, caches: Sequence[KVCache], ids: Sequence[int]) -> torch.Tensor:
        """One token for each sequence; returns logits [B, vocab].

        The sequences become the pool's members (see ``KVPool``): one indexed write and one masked SDPA call per
        layer for the whole batch."""
        m = self.model.model
        proj = self.fast
        b = len(ids)
        lengths = [c.length for c in caches]
        top = max(lengths) + 1
        self.pool.sync(caches, top)
        slot = torch.tensor([c.slot for c in caches], dtype=torch.long)
        pos = torch.tensor(lengths, dtype=torch.long)
        order = torch.empty_like(slot)
        order[slot] = torch.arange(b)  # order[s]: the batch row whose cache is pool row s
        ordered = bool(torch.equal(order, torch.arange(b)))
        # Row s of the pool attends over its first length + 1 positions (the new token included).
        mask = (torch.arange(top).unsqueeze(0) <= pos[order].unsqueeze(1)).view(b, 1, 1, top)
        x = m.embed_tokens(torch.tensor(list(ids), dtype=torch.long))  # [B, H]
        cos, sin = m.rotary_emb(x, pos.unsqueeze(1))
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            q, k, v = self._heads(proj, i, layer.input_layernorm(x), b, 1)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys, values = self.pool.keys[i], self.pool.values[i]
            keys[slot, :, pos] = k[:, :, 0]
            values[slot, :, pos] = v[:, :, 0]
            o = F.scaled_dot_product_attention(
                q if ordered else q[order],
                keys[:b, :, :top],
                values[:b, :, :top],
                attn_mask=mask,
                scale=attn.scaling,
                enable_gqa=True,
            )  # [B, heads, 1, head_dim], pool order
            x = x + proj.o(i, (o if ordered else o[slot]).reshape(b, -1))
            x = x + proj.mlp(i, layer.post_attention_layernorm(x))
        for c in caches:
            c.length += 1
        logits: torch.Tensor = proj.lm_head(m.norm(x)).float()
        return logits
