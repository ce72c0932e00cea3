"""Our checkpoint -> a Hugging Face folder that SGLang and vLLM load as is.

Our checkpoint already is a Llama ``config.json`` + ``model.safetensors``; an export adds what a GPU engine
reads beside them: the tokenizer (``tokenizer.json``, ``tokenizer_config.json`` with the chat template and a
tokenizer class every transformers version knows, ``chat_template.jinja`` for the newer ones), the
special-token ids, and ``generation_config.json``. Weights are copied as stored (a tied output layer once,
as ``save_pretrained`` writes it); the folder appears whole (written beside it, then renamed).
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

from transformers import GenerationConfig, LlamaConfig

from ._llama import CHECKPOINT_FILE, CheckpointError, load_checkpoint
from ._tokenizer import load_tokenizer

__all__ = ["export_hf"]


def export_hf(checkpoint: Path, out: Path, tokenizer_dir: Path) -> Path:
    """Write ``checkpoint`` (verified against its digest) with the tokenizer at ``tokenizer_dir`` to ``out``."""
    checkpoint, out = Path(checkpoint), Path(out)
    if out.exists():
        raise FileExistsError(f"{out} exists: an export never overwrites")
    model, _ = load_checkpoint(checkpoint)  # reads and verifies every tensor: a corrupt checkpoint is refused here
    tok = load_tokenizer(str(tokenizer_dir))
    if len(tok) > int(model.config.vocab_size):
        raise CheckpointError(f"tokenizer {tokenizer_dir} has {len(tok)} tokens, the model {model.config.vocab_size}")
    staging = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.mkdir(parents=True)
    try:
        shutil.copyfile(checkpoint / CHECKPOINT_FILE, staging / CHECKPOINT_FILE)
        cfg: LlamaConfig = model.config
        cfg.bos_token_id = tok.bos_token_id
        cfg.eos_token_id = tok.eos_token_id
        cfg.pad_token_id = tok.pad_token_id
        cfg.architectures = ["LlamaForCausalLM"]
        cfg.to_json_file(str(staging / "config.json"))
        GenerationConfig(  # type: ignore[no-untyped-call]
            bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
        ).save_pretrained(str(staging))
        tok.save_pretrained(str(staging))
        # Older transformers (and the engines pinned to them) read the template from tokenizer_config.json and
        # know the fast tokenizer by this class name, not the newer backend's.
        tc_path = staging / "tokenizer_config.json"
        tc = json.loads(tc_path.read_text())
        tc["tokenizer_class"] = "PreTrainedTokenizerFast"
        if tok.chat_template:
            tc["chat_template"] = tok.chat_template
        tc_path.write_text(json.dumps(tc, indent=2, ensure_ascii=False) + "\n")
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
