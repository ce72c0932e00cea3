"""Where the run's services are and what they run with: the settings a deployment serving a run starts with
(scheduler and proxy environment, the trainer's ``trainer.toml``), the addresses of the services (the embedded
stack's, or those of a deployment already running on the data dir), and the driver's engines on disk (so a
driver started again stops the ones a killed one left)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import tomli_w

from opengyre.config import Settings
from opengyre.eventlog import NatsCredentials
from opengyre.runtime import Stack, client_credentials, cmdline, stack_alive, stop_group

from ._config import RunConfig

if TYPE_CHECKING:
    from opengyre.engine import EngineProcess

__all__ = [
    "DeploymentMismatch",
    "Services",
    "deployment_env",
    "proxy_env",
    "record_engines",
    "scheduler_env",
    "served_name",
    "stop_leftover_engines",
    "trainer_settings",
    "write_trainer_toml",
]

log = logging.getLogger(__name__)


def proxy_env(model: str) -> dict[str, str]:
    """The proxy serves the run's model by its engines' name, recording token ids in its tokenizer."""
    from opengyre.models import resolve_model

    env = {"OPENGYRE_PROXY_MODELS": served_name(model)}
    source = resolve_model(model)
    if source.checkpoint is not None:  # a pretrained model (a preset uses the shipped byte-level tokenizer)
        env["OPENGYRE_PROXY_TOKENIZER"] = str(source.tokenizer_dir)
    return env


def scheduler_env(cfg: RunConfig) -> dict[str, str]:
    """The scheduler's RL loop and policy for this run (its service reads them at start)."""
    return {
        "OPENGYRE_SCHEDULER_POLICY": cfg.policy,
        "OPENGYRE_SCHEDULER_AUTO": "1",
        "OPENGYRE_SCHEDULER_MAX_LAG": str(cfg.max_lag),
        "OPENGYRE_SCHEDULER_GROUPS_PER_STEP": str(cfg.groups_per_step),
        "OPENGYRE_SCHEDULER_GROUP_SIZE": str(cfg.group_size),
        "OPENGYRE_SCHEDULER_STEPS": str(cfg.steps),
    }


def deployment_env(cfg: RunConfig) -> dict[str, str]:
    """What the services of a deployment (``opengyre up``) must be started with to serve ``cfg``: the scheduler's
    loop and policy, the proxy's model (each reads them at start). The run's ``sandbox`` is its harnesses' alone:
    the graders and gates keep the services' own backend (grading needs its mounts at /app, /tests, /logs, which
    the process backend cannot give, so a run whose harnesses opt out is still graded sealed)."""
    return {**scheduler_env(cfg), **proxy_env(cfg.model)}


def write_trainer_toml(cfg: RunConfig, settings: Settings, engines: list[str], init: Path | None) -> Path:
    """The trainer service's ``trainer.toml`` for this run, in the data dir (it reads it at start)."""
    path = settings.data_dir / "trainer.toml"
    path.write_text(tomli_w.dumps(trainer_settings(cfg, settings, engines, init)))
    return path


def trainer_settings(cfg: RunConfig, settings: Settings, engines: list[str], init: Path | None) -> dict[str, object]:
    """The trainer service's ``trainer.toml`` for this run: it trains as soon as a step's groups are complete
    and reloads every engine after each step (whatever role its cell has now: it serves again after the switch)."""
    out: dict[str, object] = {
        "run_id": cfg.run_id,
        "model": cfg.model,
        "algorithm": cfg.algorithm,
        "group_size": cfg.group_size,
        "groups_per_step": cfg.groups_per_step,
        "lr": cfg.lr,
        "max_paths": cfg.max_paths,
        "micro_batch_tokens": cfg.micro_batch_tokens,
        "max_staleness": max(1, cfg.max_lag),
        "seed": cfg.seed,
        "checkpoint_dir": str((settings.data_dir / "checkpoints").resolve()),
        "engines": engines,
        "engine_sync_s": 1.0,
    }
    if init is not None:
        out["init_checkpoint"] = str(init)
    return out


class DeploymentMismatch(RuntimeError):
    """The running deployment does not serve this run (no stack, a service missing, other settings)."""


@dataclass(frozen=True)
class Services:
    """Where the run's services answer: gRPC ports on ``host``, and the event log."""

    host: str
    nats_url: str
    ports: dict[str, int]
    nats_credentials: NatsCredentials | None  # the admin user of an embedded log; with --nats-url, the env's

    @classmethod
    def of(cls, stack: Stack) -> Services:
        ports = {n: c.port for n, c in stack.children.items()}
        return cls(stack.settings.host, stack.nats_url, ports, stack.admin_credentials)

    @classmethod
    def running(cls, settings: Settings) -> Services:
        """The deployment running on ``settings.data_dir`` (``opengyre up``), from its stack record."""
        found = stack_alive(settings)
        if found is None:
            raise DeploymentMismatch(f"no stack runs on {settings.data_dir}: start one with opengyre up")
        ports = {n: int(s["port"]) for n, s in found.get("services", {}).items()}
        missing = sorted({"synth", "scheduler", "proxy", "trainer"} - set(ports))
        if missing:
            raise DeploymentMismatch(f"the stack on {settings.data_dir} runs no {', '.join(missing)}")
        creds = client_credentials(settings.data_dir, embedded=bool(found.get("embedded_nats")))
        return cls(str(found.get("host") or settings.host), str(found["nats_url"]), ports, creds)


def served_name(model: str) -> str:
    from opengyre.engine import EngineConfig

    return EngineConfig(preset=model).model_name


ENGINES_FILE = "loop-engines.json"  # the driver's engines (pid, argv): a driver started again stops leftovers


def record_engines(data_dir: Path, engines: list[EngineProcess]) -> None:
    rows = [{"pid": e.pid, "argv": cmdline(e.pid), "url": e.url} for e in engines if e.pid is not None]
    (data_dir / ENGINES_FILE).write_text(json.dumps({"engines": rows}))


def stop_leftover_engines(data_dir: Path) -> None:
    """Engines die with the driver that started them (parent-death signal); where that did not reach one (another
    platform, a signal lost), stop the ones the last driver on this data dir started (checked to be the same
    program, not a process that reused the pid)."""
    path = data_dir / ENGINES_FILE
    if not path.exists():
        return
    for row in json.loads(path.read_text()).get("engines", []):
        pid, argv = int(row["pid"]), row.get("argv")
        if argv and cmdline(pid) == argv:
            log.warning("stopping engine %s (pid %d) left by an earlier driver", row.get("url"), pid)
            stop_group(pid)
    path.unlink()
