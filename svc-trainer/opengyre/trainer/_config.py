"""The trainer's typed configuration (one place for every knob, validated before anything runs)."""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainerConfig"]


@dataclass
class TrainerConfig:
    run_id: str = "default"
    model: str = "tiny"  # opengyre.models.resolve_model: tiny, small, smollm2-135m, a model folder or a .gguf
    backend: str = "torch"
    algorithm: str = "gspo"
    algorithm_params: dict[str, Any] = field(default_factory=dict)
    max_paths: int | None = 5  # Jmax; None = every path (ablation)
    group_size: int = 16  # for groups dispatched without a size
    groups_per_step: int = 1
    micro_batch_tokens: int = 4096
    packed: bool = False  # several samples per row (block-diagonal attention); pays with varlen attention kernels
    # PPO: the step's executions split into this many mini-batches, one optimizer update each, ``ppo_epochs``
    # times over; every update clips against the step-start (proximal) logprobs (decoupled PPO). Two epochs: with
    # one, a 16-execution step at lr 1e-5 clipped nothing (docs/trainer.md, "Defaults that clip").
    mini_batches: int = 4
    ppo_epochs: int = 2
    # The loss weighting rule (see ``_samples``): execution-mean | token-mean | constant (Dr. GRPO, with
    # ``loss_norm_tokens`` the constant length). None: the algorithm's (token-mean for dapo), else execution-mean.
    loss_aggregation: str | None = None
    loss_norm_tokens: int | None = None
    lr: float = 1e-5
    lr_warmup_steps: int = 0  # linear warmup from 0 over these steps
    lr_schedule: str = "constant"  # after warmup: constant | linear | cosine, down to lr * lr_min_ratio
    lr_decay_steps: int | None = None  # the step the decay reaches its floor (needed by linear and cosine)
    lr_min_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float | None = 1.0
    breaker_ratio: float = 0.5  # of the step's samples: once this share is dropped, transient ones are kept
    normalize_std: bool = True
    # Executions staler than this are filtered (None: keep all). 1 is the scheduler's default bound (phi = 1,
    # QwenGyre's operating point): a rollout may run one step ahead of the weights it was sampled with.
    max_staleness: int | None = 1
    positive_only: bool = False  # train on positive-advantage executions only (an early-stage curriculum)
    max_negative_tokens: int | None = None  # mask failures longer than this many generated tokens
    # ROLL: mask failures (below their group's baseline) with a call cut at the engine's length limit: a
    # truncated attempt says little about the task, and training it as a plain failure teaches "shorter".
    mask_truncated_negatives: bool = False
    # ROLL: one global factor on every negative-advantage execution's loss (TOPR's negative weight): < 1 damps
    # failures across the whole step, where masking targets the extreme ones.
    negative_weight: float = 1.0
    # DAPO: mask executions with a call cut at the engine's length limit; soft overlong punishment of the reward
    # over the last ``overlong_buffer_tokens`` before ``overlong_max_tokens`` generated tokens.
    overlong_filter: bool = False
    overlong_max_tokens: int | None = None
    overlong_buffer_tokens: int = 0
    # DAPO dynamic sampling: a step waits for ``groups_per_step`` groups with a learning signal (groups without
    # one are consumed with it), looking at most at ``dynamic_sampling_max_groups`` ready groups.
    dynamic_sampling: bool | None = None  # None: the algorithm's (on for dapo), else off
    dynamic_sampling_max_groups: int = 0  # 0: 10 x groups_per_step
    seed: int = 0
    checkpoint_dir: Path = Path(".opengyre/checkpoints")
    init_checkpoint: Path | None = None  # start from these weights (e.g. an SFT warm start)
    engines: list[str] = field(default_factory=list)  # engine base URLs to hot-reload after each step
    discover_engines: bool = True  # also reload the engines of cells in the rollout role (from cell events)
    engine_sync_s: float = 10.0  # while idle, bring engines serving an older version up to date this often
    engine_reload_attempts: int = 3  # a failed reload is retried this many times (with backoff) right away
    metrics_port: int | None = None  # serve Prometheus /metrics of the steps on this port (0: any free port)
    # Streaming: start a step as soon as one group is ready and feed micro-batches while the others arrive;
    # each group then carries 1/groups_per_step of the step's loss. Satellites join each step on threads, or
    # (``satellite_processes``) each in its own process over a two-rank gloo group with the core.
    streaming: bool = False
    satellites: int = 0
    satellite_processes: bool = False
    # The cells' roles in the log decide the satellites instead of ``satellites``: a cell that enters
    # ``training-satellite`` gets a satellite process that joins the running step between micro-steps, one that
    # leaves it leaves between micro-steps, and a step starts only while a cell is ``training-core`` (this process).
    follow_cell_roles: bool = False
    # Model parallelism (megatron): the run is launched on tp * pp ranks (torchrun); rank 0 leads.
    tp: int = 1
    pp: int = 1

    def validate(self) -> None:
        # The registries import torch; the service reads its config at start without training anything yet.
        from .algorithms import ALGORITHMS
        from .backends import BACKENDS

        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{f.name} must be a finite number, got {value!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {sorted(ALGORITHMS)}, got {self.algorithm!r}")
        recipe = ALGORITHMS[self.algorithm]
        fixed = (("loss_aggregation", recipe.loss_aggregation), ("dynamic_sampling", recipe.dynamic_sampling))
        for key, theirs in fixed:
            mine = getattr(self, key)
            if theirs is not None and mine is not None and mine != theirs:
                raise ValueError(
                    f"algorithm {self.algorithm} means {key} = {theirs!r}, got {mine!r} "
                    "(leave it unset, or pick an algorithm that allows it)"
                )
        if not self.negative_weight > 0:
            raise ValueError(f"negative_weight must be > 0, got {self.negative_weight}")
        if self.max_paths is not None and self.max_paths < 1:
            raise ValueError("max_paths must be >= 1 or None")
        if self.group_size < 1 or self.groups_per_step < 1 or self.micro_batch_tokens < 2:
            raise ValueError("group_size, groups_per_step must be >= 1 and micro_batch_tokens >= 2")
        if self.lr <= 0:
            raise ValueError("lr must be > 0")
        if self.mini_batches < 1 or self.ppo_epochs < 1:
            raise ValueError("mini_batches and ppo_epochs must be >= 1")
        if self.streaming and self.mini_batches != 1:
            raise ValueError(
                "a streaming step updates once all its data is in: set mini_batches = 1 (ppo_epochs may be > 1)"
            )
        from ._samples import LOSS_AGGREGATIONS

        if self.loss_aggregation is not None and self.loss_aggregation not in LOSS_AGGREGATIONS:
            raise ValueError(f"loss_aggregation must be one of {LOSS_AGGREGATIONS}, got {self.loss_aggregation!r}")
        if self.aggregation == "constant" and (self.loss_norm_tokens is None or self.loss_norm_tokens < 1):
            raise ValueError("loss_aggregation = constant needs loss_norm_tokens >= 1 (Dr. GRPO's constant length)")
        if self.lr_warmup_steps < 0 or not 0.0 <= self.lr_min_ratio <= 1.0:
            raise ValueError("lr_warmup_steps must be >= 0 and lr_min_ratio in [0, 1]")
        if self.lr_schedule not in ("constant", "linear", "cosine"):
            raise ValueError(f"lr_schedule must be constant, linear or cosine, got {self.lr_schedule!r}")
        if self.lr_schedule != "constant" and (
            self.lr_decay_steps is None or self.lr_decay_steps <= self.lr_warmup_steps
        ):
            raise ValueError("a decaying lr_schedule needs lr_decay_steps > lr_warmup_steps")
        if self.max_staleness is not None and self.max_staleness < 0:
            raise ValueError("max_staleness must be >= 0 or None")
        if self.overlong_max_tokens is not None and not 0 <= self.overlong_buffer_tokens <= self.overlong_max_tokens:
            raise ValueError("overlong_buffer_tokens must be in [0, overlong_max_tokens]")
        if self.dynamic_sampling_max_groups < 0 or self.engine_reload_attempts < 1:
            raise ValueError("dynamic_sampling_max_groups must be >= 0 and engine_reload_attempts >= 1")
        if self.tp < 1 or self.pp < 1 or (self.tp * self.pp > 1 and self.backend != "megatron"):
            raise ValueError("tp and pp must be >= 1, and above 1 only with the megatron backend")
        if self.satellites < 0 or (self.satellites and not self.streaming):
            raise ValueError("satellites must be >= 0 and need streaming = true")
        if self.satellite_processes and not self.satellites:
            raise ValueError("satellite_processes = true needs satellites >= 1")
        if self.follow_cell_roles and (self.satellites or not self.streaming):
            raise ValueError(
                "follow_cell_roles = true needs streaming = true and satellites = 0 (the cells' roles decide them)"
            )
        if not 0 < self.breaker_ratio <= 1:
            raise ValueError("breaker_ratio must be in (0, 1]")
        if not self.run_id or "/" in self.run_id or len(self.run_id) > 40:
            raise ValueError("run_id must be a non-empty name of at most 40 characters without '/'")

    @property
    def aggregation(self) -> str:
        """The loss weighting rule in force: ``loss_aggregation``, else the algorithm's, else execution-mean."""
        from .algorithms import ALGORITHMS

        recipe = ALGORITHMS[self.algorithm].loss_aggregation if self.algorithm in ALGORITHMS else None
        return self.loss_aggregation or recipe or "execution-mean"

    @property
    def uses_dynamic_sampling(self) -> bool:
        """Whether steps wait for groups with signal: ``dynamic_sampling``, else the algorithm's, else off."""
        from .algorithms import ALGORITHMS

        if self.dynamic_sampling is not None:
            return self.dynamic_sampling
        return bool(self.algorithm in ALGORITHMS and ALGORITHMS[self.algorithm].dynamic_sampling)

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
