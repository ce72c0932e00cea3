"""Checkpoints written 64-byte aligned, still safetensors, and loaded as views of one file mapping (``share``):
the same model and digest as a copying load, the file's pages mapped, not copied, and a reload that leaves the
file as it was."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from opengyre.models import (
    CheckpointError,
    build_model,
    load_checkpoint,
    load_weights,
    model_config,
    save_checkpoint,
    weights_digest,
)

CKPT = "model.safetensors"


def _mapped(path: Path) -> bool:
    """Whether this process maps ``path`` (its pages are the page cache's, shared by every process mapping it)."""
    return str(path.resolve()) in Path("/proc/self/maps").read_text()


@pytest.mark.parametrize("tied", [False, True])
def test_a_shared_load_is_the_same_model_as_a_copying_one_and_maps_the_file(tmp_path: Path, tied: bool) -> None:
    original = build_model(model_config("tiny", tie_word_embeddings=tied), seed=1)
    digest = save_checkpoint(original, tmp_path / "c", "v1")
    copied, v1 = load_checkpoint(tmp_path / "c")
    shared, v2 = load_checkpoint(tmp_path / "c", share=True)
    assert v1 == v2 == "v1" and weights_digest(shared) == digest
    ids = torch.randint(0, 288, (2, 17), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(shared(ids).logits, copied(ids).logits)
    assert _mapped(tmp_path / "c" / CKPT)
    if tied:  # assigning the mapped embedding must leave the output layer tied to it
        assert shared.lm_head.weight is shared.model.embed_tokens.weight


def test_the_file_is_aligned_and_any_safetensors_reader_reads_it(tmp_path: Path) -> None:
    model = build_model(model_config("tiny"), seed=2)
    save_checkpoint(model, tmp_path / "c", "v1")
    raw = (tmp_path / "c" / CKPT).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    assert header.pop("__metadata__") == {"weight_version": "v1"}
    assert (8 + n) % 64 == 0 and all(h["data_offsets"][0] % 64 == 0 for h in header.values())
    theirs = load_file(str(tmp_path / "c" / CKPT))
    ours = model.state_dict()
    assert theirs.keys() <= ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)


def test_a_reload_into_a_shared_model_takes_the_new_weights_and_leaves_the_old_file_as_it_was(
    tmp_path: Path,
) -> None:
    save_checkpoint(build_model(model_config("tiny"), seed=1), tmp_path / "a", "a")
    digest_b = save_checkpoint(build_model(model_config("tiny"), seed=2), tmp_path / "b", "b")
    before = (tmp_path / "a" / CKPT).read_bytes()
    model, _ = load_checkpoint(tmp_path / "a", share=True)
    with torch.no_grad():
        model.model.norm.weight.add_(1.0)  # written in place: a private copy of that page, not the file
    assert (tmp_path / "a" / CKPT).read_bytes() == before
    assert load_weights(model, tmp_path / "b", verify=True, share=True) == "b"
    assert weights_digest(model) == digest_b
    assert load_weights(model, tmp_path / "a", verify=True) == "a"  # a copying reload into mapped weights
    assert (tmp_path / "a" / CKPT).read_bytes() == before


@pytest.mark.parametrize("cut", [4, 200, -10])  # inside the length, inside the header, inside the data
def test_a_truncated_checkpoint_is_refused_by_a_shared_load(tmp_path: Path, cut: int) -> None:
    save_checkpoint(build_model(model_config("tiny"), seed=1), tmp_path / "c", "v1")
    path = tmp_path / "c" / CKPT
    raw = path.read_bytes()
    path.write_bytes(raw[:cut])
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path / "c", share=True)
