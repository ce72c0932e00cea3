"""A run driven on a deployment already running (``opengyre up --detach``), as a user would: ``opengyre train env``
prepares the data dir and prints the services' settings, ``opengyre up`` starts the stack with them, and
``opengyre train loop RUN.toml --attach`` uses the running services instead of starting its own. The stack is
still up afterwards; a run it was not started for is refused with the reason, and so is a data dir without one.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomli_w

from opengyre.config import Settings
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CellRegistered, ExecutionDispatched, ExecutionFinished, TrainingStepCompleted
from opengyre.runtime import EmbeddedNats, stack_alive

from ._hangs import reporting, run_driver
from ._oracle import oracle_kit
from .test_driver_resume import harness_toml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OPENGYRE = str(Path(sys.executable).with_name("opengyre"))


def run_config(path: Path, run_id: str, harness: Path) -> Path:
    cfg = {
        "run_id": run_id, "skills": str(ROOT / "svc-synth" / "skills"), "skill_names": ["csv-report"],
        "tasks_per_skill": 1, "model": "tiny", "cells": 2, "cell_capacity": 2, "group_size": 4,
        "groups_per_step": 1, "steps": 2, "policy": "colocate", "max_lag": 0, "timeout_s": 120.0, "lr": 1e-3,
        "harness": str(harness),
    }  # fmt: skip
    path.write_text(tomli_w.dumps(cfg))
    return path


def cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**env, "COLUMNS": "300"}  # errors in one line: the assertions read them
    return subprocess.run([OPENGYRE, *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)


@pytest.mark.slow
async def test_a_run_is_driven_on_a_running_deployment(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    log_cfg = LogConfig(stream=log_config.stream, prefix=log_config.prefix)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENGYRE_")}
    env.update(
        OPENGYRE_NATS_URL=nats_server.url, OPENGYRE_STREAM=log_cfg.stream, OPENGYRE_SUBJECT_PREFIX=log_cfg.prefix
    )
    for s in ("synth", "scheduler", "proxy", "trainer", "bench"):
        env[f"OPENGYRE_{s.upper()}_PORT"] = "0"  # any free one, bound by the service: stack.json says which
    env["OPENGYRE_PROXY_HTTP_PORT"] = "0"  # any free one: proxy.url says which
    harness = tmp_path / "harness.toml"
    harness_toml(harness, oracle_kit(tmp_path, data, ROOT / "svc-synth" / "skills", ["csv-report"]), solved=3, hang=[])
    run = run_config(tmp_path / "run.toml", "attached", harness)

    nothing = cli("train", "loop", str(run), "--data-dir", str(data), "--attach", env=env)
    assert nothing.returncode == 2 and "no stack runs on" in nothing.stderr + nothing.stdout, nothing

    prepared = cli("train", "env", str(run), "--data-dir", str(data), env=env)
    assert prepared.returncode == 0, prepared.stderr
    exports = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in prepared.stdout.splitlines())
    assert exports["OPENGYRE_SCHEDULER_POLICY"] == "colocate" and (data / "trainer.toml").is_file()
    up_env = {**env, **exports}
    up = cli("up", "--data-dir", str(data), "--detach", env=up_env)
    assert up.returncode == 0, up.stdout + up.stderr
    try:
        argv = [OPENGYRE, "train", "loop", str(run), "--data-dir", str(data), "--attach"]
        driver_out = tmp_path / "driver.out"
        with reporting(data, driver_out):
            done = run_driver(argv, env={**env, "COLUMNS": "300"}, out=driver_out)
        said = done.stdout + done.stderr
        assert done.returncode == 0, said
        assert "attached:" in said and "stack:" not in said  # no stack of its own
        # Another run than the deployment was started for: refused with why, nothing dispatched for it.
        other = cli("train", "loop", str(run_config(tmp_path / "b.toml", "other", harness)), "--data-dir", str(data),
                    "--attach", env=env)  # fmt: skip
        assert other.returncode == 2 and "trains run attached, not other" in other.stdout + other.stderr, other
        assert stack_alive(Settings.from_env(data_dir=data)) is not None  # the deployment is still up
    finally:
        down = cli("down", "--data-dir", str(data), env=env)
        assert down.returncode == 0, down.stdout + down.stderr

    log = await EventLog.connect(nats_server.url, log_cfg)
    try:
        events = [e async for _, e in log.events()]
    finally:
        await log.close()
    dispatched = [e.execution_id for e in events if isinstance(e, ExecutionDispatched)]
    finished = [e.execution_id for e in events if isinstance(e, ExecutionFinished)]
    assert len(dispatched) == 8 and sorted(dispatched) == sorted(finished), said
    assert all(x.startswith("attached-s") for x in dispatched)
    assert [e.step for e in events if isinstance(e, TrainingStepCompleted)] == [1, 2], said
    assert {e.cell_id for e in events if isinstance(e, CellRegistered)} == {"attached-cell0", "attached-cell1"}
