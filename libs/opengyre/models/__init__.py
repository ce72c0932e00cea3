"""The policy model family and tokenizer shared by the CPU engine (svc-proxy) and the trainer."""

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
