"""The local actuator really starts and stops each cell's CPU engine and trainer worker, in protocol order."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import httpx
import pytest

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CellRoleChanged, ExecutionDispatched, ExecutionFinished
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.actuators import DEFAULT_ENGINE_ARGV, DEFAULT_TRAINER_ARGV, ChildProcess, LocalActuator
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.v1 import scheduler_pb2 as pb

from .._polling import await_until
from ._service import TOKEN_ENV, running_scheduler


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow  # starts and stops real engine and trainer processes
async def test_engine_and_trainer_processes_follow_the_role(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    actuator = LocalActuator(
        tmp_path / "cells",
        trainer_argv=[*DEFAULT_TRAINER_ARGV, "--micro-step-s", "0.05"],
        start_timeout=120,
        env=TOKEN_ENV,
    )
    svc = SchedulerService(
        policy=make_policy("elastic"), loop=LoopConfig(groups_per_step=2, group_size=2), actuator=actuator, poll_s=0.05
    )
    assert "opengyre.engine" in DEFAULT_ENGINE_ARGV
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, port):
        actuator.scheduler_addr = f"127.0.0.1:{port}"
        await stub.RegisterCell(pb.RegisterCellRequest(cell_id="c0", capacity=4, role="idle"))
        # idle -> rollout: an engine process comes up and its URL goes on the event.
        up = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="rollout"))
        assert up.cell.role == "rollout" and up.cell.engine_url.startswith("http://")
        engine_pid = actuator.engines["c0"].pid
        assert engine_pid is not None
        async with httpx.AsyncClient() as http:
            r = await http.post(f"{up.cell.engine_url}/generate", json={
                "input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4, "temperature": 0}})  # fmt: skip
            assert r.status_code == 200
        # Rollout -> training: the engine process is gone, a trainer worker runs and trains what is ready.
        for g in range(2):
            for k in range(2):
                x = f"x{g}{k}"
                await event_log.append(ExecutionDispatched(execution_id=x, task_id="t", group_id=f"g{g}", step=1,
                                                           group_size=2))  # fmt: skip
                await event_log.append(ExecutionFinished(execution_id=x, status="completed", score=1.0))
        out = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="training"))
        assert out.cell.role == "training-core"
        assert not _alive(engine_pid) or await _exits(engine_pid)
        worker = actuator.trainers["c0"]
        assert worker.alive
        ctl = svc.controller
        assert ctl is not None
        async with asyncio.timeout(60):
            await await_until(
                lambda: ctl.packer.is_complete,
                "the worker claimed and completed both micro-steps of step 1",
                polls=2400,
                every=0.05,
            )
        # Back to rollout: the worker stops, a fresh engine comes up.
        back = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="rollout"))
        assert back.cell.role == "rollout" and not worker.alive and actuator.engines["c0"].alive
    await actuator.close()
    assert not actuator.engines and not actuator.trainers
    roles = []
    last = await event_log.last_seq()
    async for batch in event_log.read_batches(1, last):
        for s in await event_log.to_stored_many(batch):
            e = event_log.decode(s)
            if isinstance(e, CellRoleChanged):
                roles.append((e.from_role, e.to_role, e.reason.split(":")[0]))
    assert roles == [
        ("idle", "rollout", "operator"),
        ("rollout", "draining", "stop routing"),
        ("draining", "switching", "drained"),
        ("switching", "training-core", "trainer worker up"),
        ("training-core", "switching", "operator"),
        ("switching", "rollout", "engine up"),
    ]


async def _exits(pid: int) -> bool:
    for _ in range(100):
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_child_whose_start_is_abandoned_is_stopped(tmp_path: Path) -> None:
    """A start given up (cancelled: the controller closing mid-switch) leaves no process behind."""
    never_ready = [sys.executable, "-c", "import time; time.sleep(120)"]
    child = ChildProcess("never ready", never_ready, ready_file=tmp_path / "r", log_file=tmp_path / "log")
    start = asyncio.create_task(child.start(timeout=120))
    await await_until(lambda: child.pid is not None, "the child process started", polls=12000, every=0.01)
    pid = child.pid
    try:
        start.cancel()
        with pytest.raises(asyncio.CancelledError):
            await start
        assert not _alive(pid)  # stopped and reaped
    finally:
        if _alive(pid):
            os.kill(pid, signal.SIGKILL)
