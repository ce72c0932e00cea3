"""The policy model family and tokenizer shared by the CPU engine (svc-proxy) and the trainer."""

from ._llama import (
    MODEL_PRESETS,
    CheckpointError,
    build_model,
    checkpoint_info,
    load_checkpoint,
    load_weights,
    model_config,
    save_checkpoint,
    target_logprobs,
    token_logprobs,
)
from ._tokenizer import TOKENIZER_DIR, load_tokenizer

__all__ = [
    "MODEL_PRESETS",
    "TOKENIZER_DIR",
    "CheckpointError",
    "build_model",
    "checkpoint_info",
    "load_checkpoint",
    "load_tokenizer",
    "load_weights",
    "model_config",
    "save_checkpoint",
    "target_logprobs",
    "token_logprobs",
]
