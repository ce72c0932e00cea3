"""The policy model family and tokenizer shared by the CPU engine (svc-proxy) and the trainer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._export import export_hf
    from ._gguf import CHATML_TOOLS_TEMPLATE, convert_gguf
    from ._llama import (
        MODEL_PRESETS,
        CheckpointError,
        build_model,
        checkpoint_info,
        load_checkpoint,
        load_state,
        load_weights,
        model_config,
        model_state,
        save_checkpoint,
        weights_digest,
    )
    from ._logprobs import LOGITS_CHUNK_BYTES, logits_chunk_tokens, target_logprobs, token_logprobs, token_stats
    from ._registry import PRETRAINED, ModelSource, Pretrained, check_model, default_model_cache, resolve_model
    from ._tokenizer import TOKENIZER_DIR, load_tokenizer

_WHERE: dict[str, str] = {
    "export_hf": "_export",
    "CHATML_TOOLS_TEMPLATE": "_gguf",
    "convert_gguf": "_gguf",
    "MODEL_PRESETS": "_llama",
    "CheckpointError": "_llama",
    "build_model": "_llama",
    "checkpoint_info": "_llama",
    "load_checkpoint": "_llama",
    "load_state": "_llama",
    "load_weights": "_llama",
    "model_config": "_llama",
    "model_state": "_llama",
    "save_checkpoint": "_llama",
    "weights_digest": "_llama",
    "LOGITS_CHUNK_BYTES": "_logprobs",
    "logits_chunk_tokens": "_logprobs",
    "target_logprobs": "_logprobs",
    "token_logprobs": "_logprobs",
    "token_stats": "_logprobs",
    "PRETRAINED": "_registry",
    "ModelSource": "_registry",
    "Pretrained": "_registry",
    "check_model": "_registry",
    "default_model_cache": "_registry",
    "resolve_model": "_registry",
    "TOKENIZER_DIR": "_tokenizer",
    "load_tokenizer": "_tokenizer",
}

__all__ = [
    "CHATML_TOOLS_TEMPLATE",
    "LOGITS_CHUNK_BYTES",
    "MODEL_PRESETS",
    "PRETRAINED",
    "TOKENIZER_DIR",
    "CheckpointError",
    "ModelSource",
    "Pretrained",
    "build_model",
    "check_model",
    "checkpoint_info",
    "convert_gguf",
    "default_model_cache",
    "export_hf",
    "load_checkpoint",
    "load_state",
    "load_tokenizer",
    "load_weights",
    "logits_chunk_tokens",
    "model_config",
    "model_state",
    "resolve_model",
    "save_checkpoint",
    "target_logprobs",
    "token_logprobs",
    "token_stats",
    "weights_digest",
]


# Names load on first use (PEP 562): the proxy's gateway needs only load_tokenizer (transformers' tokenizer,
# ~0.8 CPU-s); eager, it also paid for torch and the Llama model (~4 CPU-s more; bench/import_cost.py).
__getattr__ = lazy_exports(__name__, _WHERE)
