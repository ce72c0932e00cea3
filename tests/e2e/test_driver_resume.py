"""The rollout driver killed mid-run and started again on the same data dir completes the run, from the log.

``opengyre train loop RUN.toml`` runs as a process of its own (the stack's services are its children and die with
it). Step 1's members m0 and m1 solve and finish; m2 and m3 hang, so when the driver is SIGKILLed two executions
have finished and two are in flight, and no training step can have started (on-policy: step 1 waits for its whole
group). The harness spec is then replaced by one that does not hang, and the same command runs again. What the
event log must show: every dispatched execution finished exactly once (the two in flight ended as abandoned, an
infrastructure failure the trainer masks), each step trained once, the run at its last step, and the cells
pointed at the new engines by the scheduler's ``cell-engine-changed`` (the calls of step 2 reached them).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import tomli_w

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import (
    CellEngineChanged,
    CellRegistered,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TrainingStepCompleted,
)
from opengyre.runtime import EmbeddedNats

from ._hangs import reporting, run_driver
from ._oracle import OracleKit, oracle_kit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
OPENGYRE = Path(sys.executable).with_name("opengyre")


def harness_toml(path: Path, kit: OracleKit, solved: int, hang: list[int]) -> None:
    """The scripted oracle as a TOML harness spec (its answers the test's own, mounted read-only)."""
    argv = kit.argv(solved, dict.fromkeys(hang, "hang"))
    env = {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"}
    path.write_text(tomli_w.dumps({"name": "scripted-solver", "argv": argv, "env": env, "mounts": kit.mounts}))


def driver_env(nats: EmbeddedNats, log: LogConfig) -> dict[str, str]:
    """The driver's stack on the test's nats-server and stream, on ports of its own (fresh for each start)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENGYRE_")}
    env.update(OPENGYRE_NATS_URL=nats.url, OPENGYRE_STREAM=log.stream, OPENGYRE_SUBJECT_PREFIX=log.prefix)
    for s in ("synth", "scheduler", "proxy", "trainer", "bench"):
        env[f"OPENGYRE_{s.upper()}_PORT"] = "0"  # any free one, bound by the service: stack.json says which
    env["OPENGYRE_PROXY_HTTP_PORT"] = "0"  # any free one: proxy.url says which
    return env


async def wait_for(log: EventLog, done: object) -> list[Event]:
    """Follow the log until ``done(events so far)`` holds."""
    seen: list[Event] = []
    async for _, e in log.subscribe(start_seq=1):
        seen.append(e)
        if done(seen):  # type: ignore[operator]
            return seen
    raise AssertionError("the log subscription ended")


def leftover_harnesses(tmp: Path) -> list[int]:
    """Harness processes of this test still running (the hung ones the killed driver left behind)."""
    out = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "_solver_harness.py" in cmd and str(tmp) in cmd:
                out.append(int(proc.name))
    return out


@pytest.mark.slow
async def test_a_driver_killed_mid_run_resumes_from_the_log_and_completes_the_run(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    harness = tmp_path / "harness.toml"
    run = tmp_path / "run.toml"
    cfg = {
        "run_id": "resume", "skills": str(ROOT / "svc-synth" / "skills"), "skill_names": ["csv-report"],
        "tasks_per_skill": 1, "model": "tiny", "cells": 2, "cell_capacity": 2, "group_size": 4,
        "groups_per_step": 1, "steps": 2, "policy": "colocate", "max_lag": 0, "timeout_s": 600.0, "lr": 1e-3,
        "harness": str(harness),
    }  # fmt: skip
    run.write_text(tomli_w.dumps(cfg))
    # The driver's blobs go to the default bucket (no setting names another); the test reads what it wrote.
    log_cfg = LogConfig(stream=log_config.stream, prefix=log_config.prefix)
    kit = oracle_kit(tmp_path, data, ROOT / "svc-synth" / "skills", ["csv-report"])
    harness_toml(harness, kit, solved=2, hang=[2, 3])
    argv = [str(OPENGYRE), "train", "loop", str(run), "--data-dir", str(data)]
    # Output to files, not pipes: the killed driver's engines and hung harnesses would hold a pipe open.
    out1_path, out2_path = tmp_path / "driver1.out", tmp_path / "driver2.out"
    with out1_path.open("wb") as out:
        first = subprocess.Popen(argv, env=driver_env(nats_server, log_cfg), stdout=out, stderr=subprocess.STDOUT)
    log = await EventLog.connect(nats_server.url, log_cfg)
    try:

        def two_finished(events: list[Event]) -> bool:
            return sum(isinstance(e, ExecutionFinished) for e in events) >= 2

        try:
            with reporting(data, out1_path):
                before = await wait_for(log, two_finished)
        finally:
            first.send_signal(signal.SIGKILL)
            await asyncio.to_thread(first.wait)
        out1 = out1_path.read_text(errors="replace")
        # The moment of the kill: step 1 dispatched, two of its members finished, two in flight, nothing trained.
        assert sorted(e.step for e in before if isinstance(e, ExecutionDispatched)) == [1, 1, 1, 1], out1
        assert not any(isinstance(e, TrainingStepCompleted) for e in before), out1

        harness_toml(harness, kit, solved=3, hang=[])
        with reporting(data, out1_path, out2_path):
            second = await asyncio.to_thread(run_driver, argv, env=driver_env(nats_server, log_cfg), out=out2_path)
        out2 = second.stdout
        assert second.returncode == 0, out1 + "\n---- resumed ----\n" + out2
        events = [e async for _, e in log.events()]
    finally:
        await log.close()
        for pid in leftover_harnesses(tmp_path):  # the hung harnesses of the killed driver
            os.kill(pid, signal.SIGKILL)
    said = out1 + "\n---- resumed ----\n" + out2

    dispatched = [e for e in events if isinstance(e, ExecutionDispatched)]
    finished = [e for e in events if isinstance(e, ExecutionFinished)]
    steps = [e for e in events if isinstance(e, TrainingStepCompleted)]
    # Every execution dispatched, before the crash or after, ended exactly once: none lost, none doubled.
    assert Counter(e.execution_id for e in finished) == Counter(e.execution_id for e in dispatched), said
    assert len(dispatched) == 8 and sorted(e.step for e in dispatched) == [1] * 4 + [2] * 4, said
    fin = {e.execution_id: e for e in finished}
    # The two in flight at the kill ended as abandoned (masked infrastructure), the two finished kept their score.
    for m in ("m2", "m3"):
        e = fin[f"resume-s1-g0-{m}"]
        assert (e.status, e.failure_class, e.score) == ("infra-failed", "sandbox", None), e
    assert [fin[f"resume-s1-g0-m{i}"].score for i in (0, 1)] == [1.0, 1.0]
    assert all(fin[f"resume-s2-g0-m{i}"].score == 1.0 for i in range(3)), fin
    # Each step trained (or dropped) once, every execution consumed by exactly one step, the run at its last step.
    assert [s.step for s in steps] == [1, 2], said
    consumed = Counter(x for s in steps for x in (*s.execution_ids, *s.dropped))
    assert consumed == Counter(e.execution_id for e in dispatched), said
    # The cells follow the new engines: registered once, then moved by the scheduler, and step 2's calls went there.
    registered = {e.cell_id: e.engine_url for e in events if isinstance(e, CellRegistered)}
    moved = {e.cell_id: e.engine_url for e in events if isinstance(e, CellEngineChanged)}
    assert set(registered) == set(moved) == {"resume-cell0", "resume-cell1"}, said
    assert all(moved[c] != registered[c] for c in moved), (registered, moved)
    calls = [e for e in events if isinstance(e, ModelCallRecorded) and "-s2-" in e.execution_id]
    assert calls and {e.engine_id for e in calls} <= set(moved), {e.engine_id for e in calls}
