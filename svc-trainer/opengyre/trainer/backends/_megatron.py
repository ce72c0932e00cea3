"""The megatron-core backend: ``GPTModel`` with tensor parallelism over torch.distributed.

On CPU it runs with gloo and ``use_cpu_initialization=True`` once two CUDA-only pieces are replaced: the layer
spec's ``core_attention`` (the stock ``DotProductAttention`` asks for CUDA buffers) by a module calling
``torch.nn.fn.scaled_dot_product_attention``, and the rotary embedding's ``get_emb`` (which moves its
frequencies to the current CUDA device) by a device-agnostic one. On GPUs the same code runs with NCCL.
Weights start from, and publish as, the Hugging Face Llama layout (see ``_mcore_weights``).
"""

from __future__ import annotations

import atexit
import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import torch
import torch.distributed as dist
from torch.nn import functional as fn
from transformers import LlamaConfig

from .._packing import MicroBatch
from ..algorithms import LossOutput
from ._base import Backend, TokenStats
from ._mcore_weights import from_stage, hf_to_mcore, mcore_to_hf, shard_dim, stage_layers, to_stage, unshard

__all__ = ["MegatronBackend", "ensure_distributed"]

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # "Transformer Engine and Apex are not installed": expected on CPU
    from megatron.core import parallel_state
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy
    from megatron.core.transformer.module import MegatronModule
    from megatron.core.transformer.transformer_config import TransformerConfig


class SDPACoreAttention(MegatronModule):  # type: ignore[misc]
    """Causal attention via PyTorch SDPA, in megatron's layout: q [sq, b, np, hn], k/v [sk, b, ng, hn]."""

    def __init__(self, config: TransformerConfig, layer_number: int, attn_mask_type: Any, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection: Any = None) -> None:  # fmt: skip
        super().__init__(config=config)
        self.softmax_scale = softmax_scale

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: Any = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPA core attention: packed sequences and attention bias are not supported")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # -> [b, heads, s, hn]
        if attention_mask is None:
            out = fn.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale, enable_gqa=True)
        else:  # megatron's mask is True where attention is NOT allowed; SDPA's boolean mask is the opposite
            out = fn.scaled_dot_product_attention(
                q, k, v, attn_mask=~attention_mask, scale=self.softmax_scale, enable_gqa=True
            )
        sq, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(sq, b, -1)


class _DeviceAgnosticRope(RotaryEmbedding):  # type: ignore[misc]
    def get_emb(self, max_seq_len: int, offset: int = 0) -> torch.Tensor:
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)
        if self.rotary_interleaved:
            emb = torch.stack((freqs.view(-1, 1), freqs.view(-1, 1)), dim=-1).view(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]


def ensure_distributed(tp: int = 1, pp: int = 1) -> None:
    """Join (or, alone, create) the process group and megatron's model-parallel groups."""
    if not dist.is_initialized():
        if tp * pp != 1:
            raise RuntimeError("model parallelism needs a launched process group (torchrun or init_process_group)")
        # A file store: no port to collide with other processes on a shared machine.
        folder = tempfile.mkdtemp(prefix="og-gloo-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        dist.init_process_group("gloo", init_method=f"file://{os.path.join(folder, 'store')}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    elif (
        parallel_state.get_tensor_model_parallel_world_size() != tp
        or parallel_state.get_pipeline_model_parallel_world_size() != pp
    ):
        raise RuntimeError(f"model parallel groups exist with other sizes than tp={tp}, pp={pp}")


def transformer_config(cfg: LlamaConfig, tp: int = 1, pp: int = 1) -> TransformerConfig:
    return TransformerConfig(
        num_layers=cfg.num_hidden_layers,
        hidden_size=cfg.hidden_size,
        num_attention_heads=cfg.num_attention_heads,
        num_query_groups=cfg.num_key_value_heads,
        kv_channels=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        ffn_hidden_size=cfg.intermediate_size,
        normalization="RMSNorm",
        layernorm_epsilon=cfg.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=fn.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        pipeline_dtype=torch.float32,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        gradient_accumulation_fusion=False,
    )


def _rope_theta(cfg: LlamaConfig) -> float:
    params = getattr(cfg, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(cfg, "rope_theta", 10000.0)))


class MegatronBackend(Backend):
    name: ClassVar[str] = "megatron"

    def data_parallel(self, rank: int, world: int, replicas: int) -> tuple[int, int, Any]:
        # Replicas are megatron's data-parallel groups (the ranks of one replica shard it by TP/PP).
        return (
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_data_parallel_world_size(),
            parallel_state.get_data_parallel_group(),
        )

    def __init__(self, config: LlamaConfig, hf_state: Mapping[str, torch.Tensor], *, tp: int = 1, pp: int = 1) -> None:
        if (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default") != "default":
            raise NotImplementedError("only default RoPE is mapped to megatron")
        stage_layers(config, 0, pp)  # fails early on an uneven split
        if config.tie_word_embeddings and pp > 1:
            # megatron keeps a copy of a tied embedding on the last stage, synchronised through its embedding
            # group; that exchange is not mapped here (SmolLM2 trains with pp=1).
            raise NotImplementedError("tied embeddings with pipeline parallelism are not mapped to megatron")
        ensure_distributed(tp, pp)
        self.config = config
        self.tp, self.pp = tp, pp
        self.tp_rank = parallel_state.get_tensor_model_parallel_rank()
        self.pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        self.first_stage = parallel_state.is_pipeline_first_stage()
        self.last_stage = parallel_state.is_pipeline_last_stage()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # megatron's deprecation chatter about defaults we set on purpose
            self.model = self._build(config, tp, pp, self.first_stage, self.last_stage)
        self.model.rotary_pos_emb.__class__ = _DeviceAgnosticRope  # every stage applies RoPE in its layers
        self.load_hf_state_dict(hf_state)
        self.model.train()

    @staticmethod
    def _build(config: LlamaConfig, tp: int, pp: int, first: bool, last: bool) -> Any:
        spec = get_gpt_layer_local_spec(normalization="RMSNorm")
        spec.submodules.self_attention.submodules.core_attention = SDPACoreAttention
        return GPTModel(
            config=transformer_config(config, tp, pp),
            transformer_layer_spec=spec,
            vocab_size=config.vocab_size,
            max_sequence_length=config.max_position_embeddings,
            pre_process=first,
            post_process=last,
            # Vocab-sharded logits under TP: the logprob is a vocab-parallel cross-entropy (no gather of the
            # vocabulary, and megatron's gather asks for a CUDA device); with TP=1 it is the whole vocabulary.
            parallel_output=True,
            share_embeddings_and_output_weights=bool(config.tie_word_embeddings),
            position_embedding_type="rope",
            rotary_base=int(_rope_theta(config)),
        )

    def _params(self) -> dict[str, torch.nn.Parameter]:
        return dict(self.model.named_parameters())

    def _forward(self, mb: MicroBatch) -> torch.Tensor:
        ids = mb.input_ids
        pos = torch.arange(ids.shape[1], dtype=torch.long).unsqueeze(0).expand_as(ids)
        # Packed rows: a block-diagonal causal mask. RoPE keeps positions 0..T-1 across the row: attention scores
        # depend only on relative offsets within a block, so this equals restarting positions per sample.
        blocked = mb.attention_blocked()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "tp_group is None, using default tp group"
            out: torch.Tensor = self.model(ids, pos, blocked)
        return out

    def token_logprobs(self, mb: MicroBatch) -> torch.Tensor:
        if self.pp != 1:
            raise RuntimeError("with pipeline parallelism only forward_backward runs the model (stages exchange)")
        return self._logprobs(self._forward(mb), mb)

    def _scaled(self, logits_all: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        logits = logits_all[:, :-1].float()
        if mb.temperatures is not None:  # the engine's scaling: logits / temperature (see target_logprobs)
            logits = logits / mb.temperatures.to(logits.dtype).unsqueeze(-1)
        return logits

    def _logprobs(self, logits_all: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        logits = self._scaled(logits_all, mb)
        targets = mb.input_ids[:, 1:]
        if self.tp == 1:
            return torch.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        nll: torch.Tensor = vocab_parallel_cross_entropy(logits.contiguous(), targets.contiguous())
        return -nll

    def _entropy(self, logits_all: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
        logits = self._scaled(logits_all, mb)
        if self.tp == 1:
            lsm = torch.log_softmax(logits, dim=-1)
            return -(lsm.exp() * lsm).sum(-1)
        # Vocab-sharded logits: H = log Z - sum(p * x), with the max, Z and sum(e^x * x) reduced over the shards.
        group = parallel_state.get_tensor_model_parallel_group()
        top = logits.max(-1).values
        dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(logits - top.unsqueeze(-1))
        z, ex = e.sum(-1), (e * logits).sum(-1)
        dist.all_reduce(z, group=group)
        dist.all_reduce(ex, group=group)
        return top + torch.log(z) - ex / z

    def forward_stats(self, mb: MicroBatch) -> TokenStats | None:
        with torch.no_grad():
            if self.pp == 1:
                out = self._forward(mb)
                return TokenStats(self._logprobs(out, mb), self._entropy(out, mb))
            # Forward only, through the stages: activations go forward, nothing comes back.
            b, t = mb.input_ids.shape
            if not self.first_stage:
                inp = torch.empty(t, b, self.config.hidden_size, dtype=torch.float32)
                dist.recv(inp, src=parallel_state.get_pipeline_model_parallel_prev_rank())
                self.model.set_input_tensor(inp)
            out = self._forward(mb)
            if not self.last_stage:
                dist.send(out.contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
                return None
            return TokenStats(self._logprobs(out, mb), self._entropy(out, mb))

    def forward_backward(self, mb: MicroBatch, loss_fn: Callable[[torch.Tensor], LossOutput]) -> LossOutput:
        if self.pp == 1:
            return super().forward_backward(mb, loss_fn)
        # One micro-batch through the stages (no interleaving): activations forward, gradients back, over
        # point-to-point sends between the neighbouring ranks of this rank's pipeline group.
        ids = mb.input_ids
        b, t = ids.shape
        inp: torch.Tensor | None = None
        if not self.first_stage:
            inp = torch.empty(t, b, self.config.hidden_size, dtype=torch.float32)
            dist.recv(inp, src=parallel_state.get_pipeline_model_parallel_prev_rank())
            inp.requires_grad_(True)
            self.model.set_input_tensor(inp)
        out = self._forward(mb)
        result: tuple[float, dict[str, float]] | None = None
        if self.last_stage:
            loss_out = loss_fn(self._logprobs(out, mb))
            loss_out.loss.backward()  # type: ignore[no-untyped-call]
            result = (float(loss_out.loss.detach()), loss_out.metrics)
        else:
            dist.send(out.detach().contiguous(), dst=parallel_state.get_pipeline_model_parallel_next_rank())
            grad = torch.empty_like(out)
            dist.recv(grad, src=parallel_state.get_pipeline_model_parallel_next_rank())
            out.backward(grad)  # type: ignore[no-untyped-call]
        if inp is not None:
            assert inp.grad is not None
            dist.send(inp.grad.contiguous(), dst=parallel_state.get_pipeline_model_parallel_prev_rank())
        shared: list[Any] = [result]
        dist.broadcast_object_list(
            shared,
            src=parallel_state.get_pipeline_model_parallel_last_rank(),
            group=parallel_state.get_pipeline_model_parallel_group(),
        )
        loss, metrics = shared[0]
        return LossOutput(loss=torch.tensor(loss), metrics=dict(metrics))

    def grad_norm(self) -> float:
        sharded = torch.zeros((), dtype=torch.float64)
        replicated = torch.zeros((), dtype=torch.float64)
        for k, p in self._params().items():
            if p.grad is None:
                continue
            sq = p.grad.detach().double().pow(2).sum()
            if shard_dim(k) is not None:
                sharded += sq
            else:
                replicated += sq  # identical on every tensor-parallel rank: counted once
        if self.tp > 1:
            dist.all_reduce(sharded, group=parallel_state.get_tensor_model_parallel_group())
        total = sharded + replicated
        if self.pp > 1:
            dist.all_reduce(total, group=parallel_state.get_pipeline_model_parallel_group())
        return math.sqrt(float(total))

    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def _gather(self, local: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The full megatron state (global layer indices) from this rank's shard of its stage."""
        full: dict[str, torch.Tensor] = {}
        if self.tp == 1:
            full = dict(local)
        else:
            group = parallel_state.get_tensor_model_parallel_group()
            for k, v in local.items():
                if shard_dim(k) is None:
                    full[k] = v
                    continue
                shards = [torch.empty_like(v) for _ in range(self.tp)]
                dist.all_gather(shards, v.contiguous(), group=group)
                full[k] = unshard(k, shards)
        full = from_stage(full, self.config, self.pp_rank, self.pp)
        if self.pp > 1:
            parts: list[Any] = [None] * self.pp
            dist.all_gather_object(parts, full, group=parallel_state.get_pipeline_model_parallel_group())
            full = {k: v for part in parts for k, v in part.items()}
        return full

    def _local(self, hf: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's megatron tensors (its TP shard of its pipeline stage) from a Hugging Face state."""
        return to_stage(hf_to_mcore(hf, self.config, self.tp_rank, self.tp), self.config, self.pp_rank, self.pp)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        local = {k: p.detach().clone() for k, p in self._params().items()}
        return mcore_to_hf(self._gather(local), self.config)

    def load_hf_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        mapped = self._local(state)
        params = self._params()
        if set(mapped) != set(params):
            raise ValueError(f"weights do not fit the GPTModel: {sorted(set(mapped) ^ set(params))}")
        with torch.no_grad():
            for k, p in params.items():
                p.copy_(mapped[k])

    def hf_grads(self) -> dict[str, torch.Tensor]:
        params = self._params()
        local = {k: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for k, p in params.items()}
        return mcore_to_hf(self._gather(local), self.config)

    def add_hf_grads(self, grads: Mapping[str, torch.Tensor]) -> None:
        mapped = self._local(grads)
        for k, p in self._params().items():
            g = mapped[k]
            p.grad = g.clone() if p.grad is None else p.grad + g
