"""A small Llama-style causal LM built from a config: the policy the CPU engine serves and the trainer trains."""

from __future__ import annotations

import hashlib
import json
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.initialization import no_init_weights

from ._aligned import map_state, save_aligned

__all__ = [
    "MODEL_PRESETS",
    "build_model",
    "checkpoint_info",
    "load_checkpoint",
    "load_state",
    "load_weights",
    "model_config",
    "model_state",
    "save_checkpoint",
    "weights_digest",
]

VOCAB_SIZE = 288  # 256 bytes + 9 specials, padded to a multiple of 32

MODEL_PRESETS: dict[str, dict[str, Any]] = {
    # ~0.2M parameters: fast enough for every test on 2 cores.
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 176,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    },
    # ~3.5M parameters: the demo's policy and the benchmarks'.
    "small": {
        "hidden_size": 256,
        "intermediate_size": 688,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
    },
}

CHECKPOINT_FILE = "model.safetensors"
META_FILE = "opengyre.json"


def model_config(preset: str = "tiny", **overrides: Any) -> LlamaConfig:
    if preset not in MODEL_PRESETS:
        raise ValueError(f"unknown model preset {preset!r}; known: {', '.join(MODEL_PRESETS)}")
    params: dict[str, Any] = {
        "vocab_size": VOCAB_SIZE,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "hidden_act": "silu",
        "bos_token_id": None,
        "eos_token_id": 258,  # <|im_end|>
        "pad_token_id": 256,  # <|endoftext|>
        "initializer_range": 0.02,
        **MODEL_PRESETS[preset],
        **overrides,
    }
    cfg = LlamaConfig(**params)
    cfg._attn_implementation = "sdpa"
    return cfg


def build_model(config: LlamaConfig, seed: int = 0) -> LlamaForCausalLM:
    """Deterministic initial weights for a seed (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # HF gives the embedding ``padding_idx = pad_token_id``, which zeroes that row's gradient. A real model's pad
    # may be a token it must learn (SmolLM2 pads with <|im_end|>, its end of turn); padded positions come last
    # and are masked out of every loss, so they contribute no gradient anyway. Megatron has no such row.
    model.model.embed_tokens.padding_idx = None
    model.eval()  # type: ignore[no-untyped-call]
    return model


def _tied(config: Any) -> bool:
    return bool(getattr(config, "tie_word_embeddings", False))


def model_state(model: LlamaForCausalLM) -> dict[str, torch.Tensor]:
    """The model's tensors as a checkpoint holds them (detached, contiguous, on the CPU); a tied output layer is
    its embedding, so it is stored once, as ``save_pretrained`` stores it (safetensors refuses shared tensors)."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    if _tied(model.config):
        state.pop("lm_head.weight", None)
    return state


def _optional(model: LlamaForCausalLM, key: str) -> bool:
    """Keys a checkpoint may lack: buffers rebuilt from the config, and a tied output layer."""
    return key.endswith("rotary_emb.inv_freq") or (key == "lm_head.weight" and _tied(model.config))


def load_state(model: LlamaForCausalLM, state: dict[str, torch.Tensor]) -> None:
    """Copy a whole state dict into ``model`` (a tied output layer may be absent); ``ValueError`` naming what
    does not fit."""
    missing, unexpected = model.load_state_dict(dict(state), strict=False)
    missing = [m for m in missing if not _optional(model, m)]
    if missing or unexpected:
        raise ValueError(f"state does not fit the model: missing={missing} unexpected={unexpected}")


def _digest(state: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        t = state[k].detach().contiguous().cpu()
        h.update(t.view(torch.uint8).reshape(-1).numpy().data)  # the bytes in place: no copy of the weights
    return h.hexdigest()


def weights_digest(model: LlamaForCausalLM) -> str:
    """The sha256 of the model's weights, as ``save_checkpoint`` records it: two models with the same digest
    compute the same keys and values (an engine refuses another's KV cache unless the digests match)."""
    return _digest(model_state(model))


def save_checkpoint(model: LlamaForCausalLM, directory: Path, weight_version: str) -> str:
    """Write ``config.json``, ``model.safetensors`` and our metadata; returns the weights' sha256.

    A new checkpoint folder appears whole or not at all (written beside it, then renamed), so a reader or a
    restarted trainer never sees a half-written one. Rewriting an existing folder replaces each file atomically,
    the metadata last.
    """
    directory = Path(directory)
    state = model_state(model)
    digest = _digest(state)
    fresh = not directory.exists()
    target = directory.with_name(f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}") if fresh else directory
    target.mkdir(parents=True, exist_ok=True)
    # 64-byte-aligned tensors, so engines map the file and share its pages (``load_checkpoint(share=True)``).
    _write_atomic(target / CHECKPOINT_FILE, lambda p: save_aligned(state, p, {"weight_version": weight_version}))
    _write_atomic(target / "config.json", lambda p: model.config.to_json_file(str(p)))
    meta = json.dumps({"weight_version": weight_version, "sha256": digest}) + "\n"
    _write_atomic(target / META_FILE, lambda p: p.write_text(meta))
    if fresh:
        try:
            target.rename(directory)
        except OSError:
            shutil.rmtree(target, ignore_errors=True)  # someone else wrote it first
            if not directory.exists():
                raise
    return digest


def _write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    tmp.replace(path)


def checkpoint_info(directory: Path) -> dict[str, str] | None:
    """``{"weight_version", "sha256"}`` of a complete checkpoint folder, or None when there is none."""
    meta = Path(directory) / META_FILE
    if not meta.is_file() or not (Path(directory) / CHECKPOINT_FILE).is_file():
        return None
    info = json.loads(meta.read_text())
    return {"weight_version": str(info.get("weight_version", "")), "sha256": str(info.get("sha256", ""))}


class CheckpointError(ValueError):
    """A checkpoint that must not be loaded: unreadable, corrupt (its weights do not hash to its digest), without
    a digest where one is required, or not the model's shape. The model is left as it was."""


def load_weights(model: LlamaForCausalLM, directory: Path, *, verify: bool | None = None, share: bool = False) -> str:
    """Load a checkpoint's weights into ``model`` in place; returns its weight version.

    ``verify``: check the weights against the sha256 in the checkpoint's metadata before touching the model
    (True: a digest is required; None: when the metadata has one, as a Hugging Face folder has none; False:
    never). Nothing is copied into the model unless every tensor is there, of the right shape, and verified:
    a refused checkpoint leaves the model serving what it served.

    ``share``: the model's weights become views of a copy-on-write mapping of the file (no copy; processes
    loading the same checkpoint share its pages) instead of copies in the model's own tensors."""
    directory = Path(directory)
    try:
        state = map_state(directory / CHECKPOINT_FILE)[0] if share else load_file(str(directory / CHECKPOINT_FILE))
        meta = json.loads((directory / META_FILE).read_text()) if (directory / META_FILE).exists() else {}
    except (OSError, ValueError, SafetensorError) as exc:  # a missing or truncated file, a header that does not parse
        raise CheckpointError(f"checkpoint {directory} cannot be read: {exc}") from exc
    expected = str(meta.get("sha256", "")) if isinstance(meta, dict) else ""
    if verify and not expected:
        raise CheckpointError(f"checkpoint {directory} has no sha256 in {META_FILE}: nothing to verify it against")
    if verify is not False and expected:
        got = _digest(state)
        if got != expected:
            raise CheckpointError(
                f"checkpoint {directory} is corrupt: its weights hash to {got[:16]}..., its {META_FILE} says "
                f"{expected[:16]}..."
            )
    own = model.state_dict()
    missing = [k for k in own if k not in state and not _optional(model, k)]
    unexpected = [k for k in state if k not in own]
    wrong = [k for k in state if k in own and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise CheckpointError(
            f"checkpoint {directory} does not fit the model: missing={missing} unexpected={unexpected} shape={wrong}"
        )
    model.load_state_dict(state, strict=False, assign=share)
    if share and _tied(model.config):
        model.tie_weights()  # assigning replaced the embedding: the output layer must be it again, not the old one
    return str(meta.get("weight_version", directory.name)) if isinstance(meta, dict) else directory.name


def load_checkpoint(directory: Path, *, share: bool = False) -> tuple[LlamaForCausalLM, str]:
    """The model of a checkpoint folder and its weight version. ``share``: weights mapped from the file, not
    copied (``load_weights``), and the model built without initialising the weights the file replaces."""
    directory = Path(directory)
    try:
        config = LlamaConfig.from_json_file(str(directory / "config.json"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {directory} has no readable config.json: {exc}") from exc
    config._attn_implementation = "sdpa"
    if share:
        with no_init_weights():  # torch.empty: pages never touched, never resident, replaced by the mapping
            model = build_model(config)
    else:
        model = build_model(config)
    version = load_weights(model, directory, share=share)
    return model, version
