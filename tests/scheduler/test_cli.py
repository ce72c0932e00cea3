"""``opengyre sim`` and ``opengyre scheduler`` from the command line."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.eventlog import EventLog, LogConfig
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.actuators import ExternalActuator
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService

from ._service import TOKEN_ENV, running_scheduler

runner = CliRunner()
SMALL = ["--steps", "3", "--groups-per-step", "2", "--cells", "2", "--nodes-per-cell", "1", "--slots-per-cell", "16"]


def test_sim_run_compares_policies_and_writes_json_and_a_plot(tmp_path: Path) -> None:
    out, png = tmp_path / "r.json", tmp_path / "u.png"
    r = runner.invoke(app, ["sim", "run", *SMALL, "-p", "elastic", "-p", "async:train_cells=1", "--json", str(out),
                            "--plot", str(png)])  # fmt: skip
    assert r.exit_code == 0, r.output
    assert "elastic" in r.output and "async" in r.output and "ideal bound" in r.output
    rows = json.loads(out.read_text())
    assert [x["policy"] for x in rows] == ["elastic", "async"]
    assert all(x["trained"]["groups"] == x["trained"]["dispatched_groups"] == 3 * 2 for x in rows)
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_sim_run_compares_against_async_at_its_best_split_and_says_which(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    args = ["--steps", "3", "--groups-per-step", "4", "--cells", "4", "--nodes-per-cell", "1", "--slots-per-cell", "8"]
    r = runner.invoke(app, ["sim", "run", *args, "-p", "elastic", "-p", "async", "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = json.loads(out.read_text())
    split = rows[1]["split"]
    assert f"async: best fixed split {split} training cells of 4 (tried 1, 2, 3)" in r.output
    each = {}
    for k in (1, 2, 3):
        one = runner.invoke(app, ["sim", "run", *args, "-p", f"async:train_cells={k}", "--json", str(out)])
        each[k] = json.loads(out.read_text())[0]["hours"]
        assert one.exit_code == 0
    assert rows[1]["hours"] == min(each.values()) and each[split] == rows[1]["hours"]


def test_sim_run_refuses_an_unknown_policy() -> None:
    r = runner.invoke(app, ["sim", "run", *SMALL, "-p", "fastest"])
    assert r.exit_code == 2 and "unknown policy" in r.output


async def test_scheduler_commands_against_the_live_service(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    svc = SchedulerService(policy=make_policy("elastic"), loop=LoopConfig(), actuator=ExternalActuator())
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (_, port):
        addr = ["--addr", f"127.0.0.1:{port}"]

        def cli(*args: str):  # type: ignore[no-untyped-def]
            return asyncio.to_thread(runner.invoke, app, ["scheduler", *args, *addr], env=TOKEN_ENV)

        r = await cli("register", "c0", "--capacity", "8")
        assert r.exit_code == 0 and "registered c0" in r.output, r.output
        r = await cli("register", "c0")
        assert r.exit_code == 1 and "ALREADY_EXISTS" in r.output
        r = await cli("state")
        assert r.exit_code == 0 and "c0" in r.output and "rollout" in r.output and "CR(t)" in r.output
        r = await cli("force", "c9", "training")
        assert r.exit_code == 1 and "NOT_FOUND" in r.output
        r = await cli("drain", "c0")
        assert r.exit_code == 0 and "c0 is idle" in r.output
        r = await cli("watch", "--updates", "1")
        assert r.exit_code == 0 and "idle" in r.output
