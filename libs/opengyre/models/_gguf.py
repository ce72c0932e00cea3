"""A GGUF file -> our checkpoint folder (safetensors, config.json, tokenizer files), once, cached by digest.

transformers reads the GGUF (with the ``gguf`` package): it dequantizes the weights, undoes llama.cpp's
rotary permutation of the q/k projections and rebuilds the BPE tokenizer from the file's vocabulary and
merges. Doing that ourselves would duplicate a tested converter; what we add is the cache, the checks and
the chat template (the model's ChatML, extended with Hermes-style tools, see ``CHATML_TOOLS_TEMPLATE``).

The folder is written beside its final name and renamed into place: a crash mid-conversion leaves no
half-written model in the cache, and a file that is missing, truncated or not a GGUF gives an error naming it.
"""

from __future__ import annotations

import hashlib
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from ._llama import CheckpointError, build_model, checkpoint_info, load_state, save_checkpoint

__all__ = ["CHATML_TOOLS_TEMPLATE", "convert_gguf", "file_sha256"]

# SmolLM2's own template (ChatML, its default system prompt when the conversation has none), extended with one
# documented tool format, Hermes-style as Qwen models use it: the tools' JSON schemas in the system prompt, a
# call as ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in the assistant's text, a result as a
# user turn wrapped in ``<tool_response>``. The base template has no tool syntax, so this is the one we define.
CHATML_TOOLS_TEMPLATE = (
    # transformers renders with trim_blocks (a newline right after a tag is dropped): such newlines are
    # written as expressions, so the text is exactly ChatML's.
    "{% set default_system = 'You are a helpful AI assistant named SmolLM, trained by Hugging Face' %}"
    "{% if messages and messages[0].role == 'system' %}"
    "{% set system = messages[0].content %}{% set rest = messages[1:] %}"
    "{% else %}{% set system = default_system %}{% set rest = messages %}{% endif %}"
    "<|im_start|>system\n{{ system }}"
    "{% if tools %}{{ '\\n\\n' }}# Tools\n\nYou may call one or more functions to assist with the user query. "
    "Function signatures are within <tools></tools> XML tags:\n<tools>"
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>\n\n"
    "For each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>{% endif %}<|im_end|>\n"
    "{% for message in rest %}"
    "{% if message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for tc in message.tool_calls or [] %}"
    "{% if message.content or not loop.first %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ tc.function.name }}", "arguments": '
    "{{ tc.function.arguments if tc.function.arguments is string else tc.function.arguments | tojson }}}"
    "\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


_CONVERSION = 1  # bump when the conversion itself changes


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def convert_gguf(
    path: Path,
    cache: Path,
    *,
    expected_sha256: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """The checkpoint folder for GGUF ``path`` under ``cache`` (converted now unless already there)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    digest = file_sha256(path)
    if expected_sha256 is not None and digest != expected_sha256:
        raise CheckpointError(
            f"GGUF file {path} is corrupt or not the pinned one: sha256 {digest[:16]}..., expected "
            f"{expected_sha256[:16]}..."
        )
    # The key covers what the conversion adds (the template): editing it converts again, never serves a stale one.
    recipe = hashlib.sha256(f"{_CONVERSION}\n{CHATML_TOOLS_TEMPLATE}".encode()).hexdigest()
    target = Path(cache) / f"{path.stem}-{digest[:16]}-{recipe[:8]}"
    if checkpoint_info(target) is not None and (target / "tokenizer.json").is_file():
        return target
    if log is not None:
        log(f"converting {path} into {target} (once)")
    model, tokenizer = _read_gguf(path)
    staging = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        save_checkpoint(model, staging, weight_version=f"{path.stem}-{digest[:16]}")
        tokenizer.chat_template = CHATML_TOOLS_TEMPLATE
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
        tokenizer.save_pretrained(str(staging))
        model.generation_config.save_pretrained(str(staging))
        try:
            staging.rename(target)
        except OSError:
            if checkpoint_info(target) is None:  # not someone else's finished conversion
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _read_gguf(path: Path) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    # transformers' GGUF reader directly: ``from_pretrained(gguf_file=...)`` would also want ``accelerate`` for
    # nothing we use. The model is built from the file's config, then every tensor is loaded into it.
    from transformers import AutoTokenizer, LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    try:
        config = LlamaConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        if config.model_type != "llama":
            raise ValueError(f"architecture {config.model_type!r} is not a Llama")
        config._attn_implementation = "sdpa"
        config.dtype = torch.float32
        model = build_model(config)
        parsed = load_gguf_checkpoint(  # type: ignore[no-untyped-call]
            str(path), return_tensors=True, model_to_load=model, torch_dtype=torch.float32
        )
        load_state(model, parsed["tensors"])
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as exc:  # the reader raises many types for a bad file: each means "unreadable"
        raise CheckpointError(f"GGUF file {path} cannot be read: {type(exc).__name__}: {exc}") from exc
    if not isinstance(tokenizer, PreTrainedTokenizerFast):
        raise CheckpointError(f"GGUF file {path}: its tokenizer is not a fast (tokenizer.json) one")
    return model, tokenizer
