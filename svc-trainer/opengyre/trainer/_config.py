"""The trainer's typed configuration (one place for every knob, validated before anything runs)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainerConfig"]


@dataclass
class TrainerConfig:
    run_id: str = "default"
    model: str = "tiny"  # opengyre.models preset
    backend: str = "torch"
    algorithm: str = "gspo"
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    max_paths: int | None = 5  # Jmax; None = every path (ablation)
    group_size: int = 16  # for groups dispatched without a size
    groups_per_step: int = 1
    micro_batch_tokens: int = 4096
    packed: bool = False  # several samples per row (block-diagonal attention); pays with varlen attention kernels
    lr: float = 1e-5
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    breaker_ratio: float = 0.5
    normalize_std: bool = True
    max_staleness: int | None = None  # executions staler than this are filtered (None: keep all)
    positive_only: bool = False  # train on positive-advantage executions only (an early-stage curriculum)
    max_negative_tokens: int | None = None  # mask failures longer than this many generated tokens
    seed: int = 0
    checkpoint_dir: Path = Path(".opengyre/checkpoints")
    init_checkpoint: Path | None = None  # start from these weights (e.g. an SFT warm start)
    engines: list[str] = field(default_factory=list)  # engine base URLs to hot-reload after each step
    discover_engines: bool = True  # also reload the engines of cells in the rollout role (from cell events)
    engine_sync_s: float = 10.0  # while idle, bring engines serving an older version up to date this often
    # Streaming: start a step as soon as one group is ready and feed micro-batches while the others arrive;
    # each group then carries 1/groups_per_step of the step's loss. Satellites join each step on threads.
    streaming: bool = False
    satellites: int = 0
    # Model parallelism (megatron): the run is launched on tp * pp ranks (torchrun); rank 0 leads.
    tp: int = 1
    pp: int = 1

    def validate(self) -> None:
        # The registries import torch; the service reads its config at start without training anything yet.
        from .algorithms import ALGORITHMS
        from .backends import BACKENDS

        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {self.algorithm!r}")
        if self.max_paths is not None and self.max_paths < 1:
            raise ValueError("max_paths must be >= 1 or None")
        if self.group_size < 1 or self.groups_per_step < 1 or self.micro_batch_tokens < 2:
            raise ValueError("group_size, groups_per_step must be >= 1 and micro_batch_tokens >= 2")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")
        if self.tp < 1 or self.pp < 1 or (self.tp * self.pp > 1 and self.backend != "megatron"):
            raise ValueError("tp and pp must be >= 1, and above 1 only with the megatron backend")
        if self.satellites < 0 or (self.satellites and not self.streaming):
            raise ValueError("satellites must be >= 0 and need streaming = true")
        if not 0 < self.breaker_ratio <= 1:
            raise ValueError("breaker_ratio must be in (0, 1]")
        if not self.run_id or "/" in self.run_id or len(self.run_id) > 40:
            raise ValueError("run_id must be a non-empty name of at most 40 characters without '/'")

    @classmethod
    def from_dict(cls, data: dict[str, Any], base: Path | None = None) -> TrainerConfig:
        """From a flat mapping of field names (a ``trainer.toml``); relative paths resolve against ``base``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown trainer settings: {', '.join(unknown)}")
        values = dict(data)
        if values.get("max_paths") == 0:
            values["max_paths"] = None  # 0 in a file means "all paths"
        for key in ("checkpoint_dir", "init_checkpoint"):
            if values.get(key) is not None:
                p = Path(values[key])
                values[key] = p if p.is_absolute() or base is None else base / p
        cfg = cls(**values)
        cfg.validate()
        return cfg

    @classmethod
    def from_toml(cls, path: Path) -> TrainerConfig:
        return cls.from_dict(tomllib.loads(Path(path).read_text()), base=Path(path).parent)
