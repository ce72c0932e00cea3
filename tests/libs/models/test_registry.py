"""The model registry and the GGUF conversion's failure modes (cheap: no real model is converted here)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from opengyre.models import (
    CheckpointError,
    build_model,
    convert_gguf,
    load_checkpoint,
    model_config,
    model_state,
    resolve_model,
    save_checkpoint,
)


def test_presets_resolve_to_configs_and_the_byte_tokenizer(tmp_path: Path) -> None:
    src = resolve_model("tiny", tmp_path)
    assert src.preset == "tiny" and src.checkpoint is None
    assert src.config().hidden_size == model_config("tiny").hidden_size
    assert src.tokenizer().eos_token == "<|im_end|>"
    assert not any(tmp_path.iterdir())  # a preset converts nothing


def test_unknown_names_and_missing_files_are_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        resolve_model("nope", tmp_path)
    missing = tmp_path / "absent.gguf"
    with pytest.raises(CheckpointError, match=f"GGUF file {missing} does not exist"):
        resolve_model(str(missing), tmp_path / "cache")
    folder = tmp_path / "empty-model"
    folder.mkdir()
    with pytest.raises(CheckpointError, match=f"model folder {folder} has no config.json"):
        resolve_model(str(folder), tmp_path / "cache")


@pytest.mark.parametrize(
    "content", [b"", b"GGUF\x03\x00\x00\x00\x01", os.urandom(4096)], ids=["empty", "truncated", "garbage"]
)
def test_a_truncated_or_corrupt_gguf_names_the_file_and_leaves_nothing_in_the_cache(
    tmp_path: Path, content: bytes
) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(content)
    cache = tmp_path / "cache"
    with pytest.raises(CheckpointError, match=f"GGUF file {bad} cannot be read"):
        convert_gguf(bad, cache)
    assert not cache.exists() or not any(cache.iterdir())  # no half-written folder, no staging leftovers


def test_a_gguf_that_is_not_the_pinned_file_is_refused_before_conversion(tmp_path: Path) -> None:
    other = tmp_path / "model.gguf"
    other.write_bytes(b"GGUF not the pinned one")
    pinned = hashlib.sha256(b"something else").hexdigest()
    with pytest.raises(CheckpointError, match=f"GGUF file {other} is corrupt or not the pinned one"):
        convert_gguf(other, tmp_path / "cache", expected_sha256=pinned)
    assert not (tmp_path / "cache").exists()


def test_a_tied_model_is_saved_once_and_loaded_back_tied(tmp_path: Path) -> None:
    cfg = model_config("tiny", tie_word_embeddings=True)
    model = build_model(cfg, seed=3)
    assert "lm_head.weight" not in model_state(model)  # safetensors refuses the shared tensor twice
    save_checkpoint(model, tmp_path / "ck", "v1")
    back, version = load_checkpoint(tmp_path / "ck")
    assert version == "v1"
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(back(input_ids=ids).logits, model(input_ids=ids).logits)
    folder = resolve_model(str(tmp_path / "ck"), tmp_path / "cache")
    assert folder.checkpoint == tmp_path / "ck" and folder.config().tie_word_embeddings


@pytest.mark.parametrize("damage", ["truncate", "drop-config"])
def test_a_damaged_checkpoint_names_its_folder(tmp_path: Path, damage: str) -> None:
    save_checkpoint(build_model(model_config("tiny")), tmp_path / "ck", "v1")
    if damage == "truncate":
        f = tmp_path / "ck" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:1000])
    else:
        (tmp_path / "ck" / "config.json").unlink()
    with pytest.raises(CheckpointError, match=str(tmp_path / "ck")):
        load_checkpoint(tmp_path / "ck")
