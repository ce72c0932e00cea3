"""A run's configuration (``opengyre train loop RUN.toml``): what to synthesize, how to roll out, how to train.

Every knob in one typed struct, decoded strictly (an unknown key or a wrong type is an error naming it) and
checked before anything starts.
"""

from __future__ import annotations

import math
import re
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import msgspec

if TYPE_CHECKING:
    from opengyre.harness import HarnessSpec

__all__ = ["BUILTIN_ARGS", "RunConfig", "RunConfigError"]

_ROOT = Path(__file__).resolve().parents[3]


BUILTIN_ARGS = ("--max-turns", "6")  # the built-in harness's flags where the run gives none
_RUN_ID = re.compile(r"[A-Za-z0-9_-]{1,24}")
# The trainer's settings the run passes on as they are (the driver's trainer.toml): checked by its own config.
_TRAINER_KEYS = (
    "run_id",
    "model",
    "algorithm",
    "group_size",
    "groups_per_step",
    "lr",
    "max_paths",
    "micro_batch_tokens",
)


# The configs ``check()`` passed, by identity: the CLI checks before anything starts (a bad config is one line)
# and ``run_loop`` checks what it is given, so the same object is checked once (frozen: it cannot change since).
_CHECKED: dict[int, weakref.ref[RunConfig]] = {}


class RunConfigError(ValueError):
    """The run configuration is invalid; the message says which setting and why."""


class RunConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, weakref=True):
    run_id: str = "loop"  # weight versions are <run_id>-s<step>
    seed: int = 0
    # --- synthesis (svc-synth): skills in, validated tasks out ---
    skills: str = str(_ROOT / "svc-synth" / "skills")  # a folder or archive of Agent Skills
    skill_names: list[str] = msgspec.field(default_factory=list)  # a subset by name (empty: every accepted skill)
    tasks_per_skill: int = 1
    challenges: int = 1  # difficulty patterns instantiated per task
    level: int = 0  # their starting knob level (0-3)
    # --- rollout (svc-scheduler dispatches, the proxy records, the harness solves) ---
    model: str = "tiny"  # opengyre.models.resolve_model: tiny, small, smollm2-135m, a folder
    cells: int = 2  # CPU rollout cells, one engine each
    cell_capacity: int = 4  # executions a cell runs at once
    engine_threads: int = 1  # torch threads per engine process
    group_size: int = 4  # G executions per task per step
    groups_per_step: int = 1  # groups per training step (the tasks take turns), dispatched together
    steps: int = 2
    policy: str = "colocate"  # a scheduler policy (opengyre.scheduler POLICIES)
    max_lag: int = 0  # phi: rollouts of step s start once step s-1-max_lag is trained (0: on-policy)
    timeout_s: float = 300.0  # each execution's time limit (the harness is killed past it)
    # "builtin" (the reference agent), a preset's name (a real harness, unmodified: claude-code, codex, opencode,
    # mini-swe-agent, openai-agents; opengyre.harness.preset_names), or a HarnessSpec TOML file. A preset's name
    # wins over a file of the same name.
    harness: str = "builtin"
    harness_args: list[str] | None = None  # the built-in harness's flags (None: BUILTIN_ARGS); only for builtin
    # SGLang-protocol engines already serving the run's model (GPU servers started elsewhere), one per cell: the run
    # uses them instead of starting CPU engines (``cells`` must match); the trainer reloads them after each step.
    engines: list[str] = msgspec.field(default_factory=list)
    # The sandbox backend of the run's harnesses (opengyre.sandbox: namespace, none, ...); "": $OPENGYRE_SANDBOX,
    # else namespace. ``none`` isolates nothing: an explicit opt-out. Not the graders' and gates' (the services'
    # own $OPENGYRE_SANDBOX, else namespace): grading needs /app, /tests, /logs mounted, which ``none`` cannot give.
    sandbox: str = ""
    # The memory the rollouts of one group share (MiB): the kernel's limit on one cgroup their harnesses' commands
    # nest in (SandboxLimits.memory_group); a run refuses to roll out where no cgroup can be made. 0: no shared
    # budget (each harness keeps its per-process memory_mb only).
    group_memory_mb: int = 8192
    # --- training (svc-trainer) ---
    algorithm: str = "gspo"
    lr: float = 1e-4
    max_paths: int = 5
    micro_batch_tokens: int = 4096
    sft_epochs: int = 0  # warm start on the tasks' reference solutions first (0: none)
    sft_lr: float = 1e-3

    def validate(self) -> RunConfig:
        def bad(why: str) -> RunConfigError:
            return RunConfigError(f"run config: {why}")

        for name in self.__struct_fields__:
            value = getattr(self, name)
            if isinstance(value, float) and not math.isfinite(value):
                raise bad(f"{name} must be a finite number, got {value!r}")
        if not _RUN_ID.fullmatch(self.run_id):
            # Cell, group and weight-version ids are made from it (<run_id>-cell0, <run_id>-s1-g0, <run_id>-s1).
            raise bad(f"run_id must be 1 to 24 of A-Z a-z 0-9 _ -, got {self.run_id!r}")
        names = (
            "tasks_per_skill",
            "cells",
            "cell_capacity",
            "group_size",
            "groups_per_step",
            "steps",
            "engine_threads",
        )
        for name in names:
            if getattr(self, name) < 1:
                raise bad(f"{name} must be >= 1")
        if self.max_lag < 0 or self.sft_epochs < 0:
            raise bad("max_lag and sft_epochs must be >= 0")
        if not 0 <= self.level <= 3 or not 1 <= self.challenges <= 8:
            raise bad("level must be in 0..3 and challenges in 1..8")
        if self.group_size > self.cells * self.cell_capacity:  # groups go out one by one, each needs room at once
            raise bad(f"a group of {self.group_size} does not fit on {self.cells} cell(s) of {self.cell_capacity}")
        if self.group_memory_mb != 0 and self.group_memory_mb < 16:
            raise bad("group_memory_mb must be 0 (no shared budget) or >= 16")
        if self.timeout_s <= 0 or self.lr <= 0 or self.sft_lr <= 0:
            raise bad("timeout_s, lr and sft_lr must be > 0")
        if self.sandbox:
            from opengyre.sandbox import backend_names

            if self.sandbox not in backend_names():
                raise bad(f"sandbox must be one of {', '.join(backend_names())}, got {self.sandbox!r}")
        if self.harness_kind == "file" and not Path(self.harness).is_file():
            from opengyre.harness import preset_names

            raise bad(
                f"harness must be 'builtin', a preset ({', '.join(preset_names())}) or a HarnessSpec TOML file; "
                f"{self.harness!r} is none of them"
            )
        if self.harness_args is not None and self.harness_kind != "builtin":
            # A preset runs its harness as pinned, a spec file carries its own argv: the flags would go nowhere.
            raise bad(f"harness_args are the built-in harness's flags; harness {self.harness!r} takes none")
        if self.engines:
            if len(self.engines) != self.cells:
                raise bad(f"engines: {len(self.engines)} given for {self.cells} cell(s): one engine per cell")
            for url in self.engines:
                parts = urlsplit(url)
                if parts.scheme not in ("http", "https") or not parts.hostname:
                    raise bad(f"engines: {url!r} is not an http(s) URL")
            if self.sft_epochs:
                raise bad("engines: a warm start's weights load into engines the run starts; set sft_epochs = 0")
        return self

    @property
    def harness_kind(self) -> str:
        """``builtin``, ``preset`` or ``file``: what ``harness`` names."""
        from opengyre.harness import preset_names

        if self.harness == "builtin":
            return "builtin"
        return "preset" if self.harness in preset_names() else "file"

    def harness_spec(self) -> HarnessSpec:
        """The spec the run's executions run: the built-in agent with its flags, a preset, or the TOML file's."""
        from opengyre.harness import HarnessSpec, builtin_spec, harness_preset

        kind = self.harness_kind
        if kind == "builtin":
            return builtin_spec(*(BUILTIN_ARGS if self.harness_args is None else self.harness_args))
        return harness_preset(self.harness) if kind == "preset" else HarnessSpec.from_toml(Path(self.harness))

    def check(self) -> RunConfig:
        """``validate`` and, before any service starts, what the services would refuse later (the model, the
        policy, the trainer's settings, the harness spec, the skills): each asked of its own registry or parser.
        Once per config object: checking it again (``run_loop`` after the CLI) returns at once."""
        seen = _CHECKED.get(id(self))
        if seen is not None and seen() is self:
            return self
        self._check()
        key = id(self)
        _CHECKED[key] = weakref.ref(self, lambda _: _CHECKED.pop(key, None))
        return self

    def _check(self) -> None:
        self.validate()
        from opengyre.harness import HarnessNotInstalled, HarnessSpec, check_installed
        from opengyre.models import check_model
        from opengyre.scheduler.policies import make_policy
        from opengyre.trainer import TrainerConfig

        def bad(key: str, exc: BaseException) -> RunConfigError:
            why = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            return RunConfigError(f"run config: {key}: {why}")

        try:
            check_model(self.model)
        except ValueError as exc:  # CheckpointError too
            raise bad("model", exc) from None
        try:
            make_policy(self.policy)
        except (KeyError, ValueError) as exc:
            raise bad("policy", exc) from None
        trainer = {k: getattr(self, k) for k in _TRAINER_KEYS}
        try:
            settings = TrainerConfig.from_dict(trainer)
        except (TypeError, ValueError) as exc:
            raise bad("trainer settings", exc) from None
        if settings.uses_dynamic_sampling:
            # The loop dispatches exactly groups_per_step groups a step; a step waiting for more with signal
            # (DAPO over-samples) would wait for groups nobody dispatches.
            raise bad(
                "trainer settings",
                ValueError(
                    f"algorithm {self.algorithm} samples dynamically, which "
                    "needs over-sampled groups the loop does not dispatch: use gspo or grpo"
                ),
            )
        if self.harness_kind == "preset":
            try:
                check_installed(self.harness)  # the harness the executions would start is there, as pinned
            except HarnessNotInstalled as exc:
                raise RunConfigError(f"run config: harness: {exc}") from None
        elif self.harness_kind == "file":
            try:
                HarnessSpec.from_toml(Path(self.harness))
            except (OSError, ValueError) as exc:  # tomllib.TOMLDecodeError is a ValueError
                raise bad(f"harness {self.harness}", exc) from None
        self._check_skills()

    def _check_skills(self) -> None:
        """The skills source reads, and each of ``skill_names`` is among its accepted skills (synth's own reader)."""
        from opengyre.synth import ingest

        source = Path(self.skills)
        if not source.exists():
            raise RunConfigError(f"run config: skills: {source} does not exist")
        with tempfile.TemporaryDirectory(prefix="og-skills-check-") as out:
            try:
                accepted = {s.name for s in ingest(source, Path(out)).accepted}
            except (OSError, ValueError) as exc:
                raise RunConfigError(f"run config: skills: {source}: {exc}") from None
        missing = sorted(set(self.skill_names) - accepted)
        if missing or not accepted:
            raise RunConfigError(
                f"run config: skill_names: no accepted skill(s) {', '.join(missing) or '(none at all)'} in {source}; "
                f"accepted: {', '.join(sorted(accepted)) or 'none'}"
            )

    @classmethod
    def from_toml(cls, path: Path) -> RunConfig:
        try:
            cfg = msgspec.toml.decode(Path(path).read_bytes(), type=cls)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            raise RunConfigError(f"{path}: {exc}") from None
        except OSError as exc:
            raise RunConfigError(f"{path}: {exc.strerror}") from None
        if cfg.harness_kind == "file" and not Path(cfg.harness).is_absolute():
            cfg = msgspec.structs.replace(cfg, harness=str(Path(path).parent / cfg.harness))
        return cfg.validate()
