"""The `opengyre` CLI as a user runs it: a fresh data dir, an existing one, failures with clear messages."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from opengyre.config import read_grpc_token
from opengyre.eventlog import EventLog
from opengyre.runtime import NATS_ADMIN, free_port, grpc_channel, read_nats_credentials
from opengyre.v1 import common_pb2, synth_pb2_grpc

from ..._burst import scripted_burst
from ..._polling import wait_until

# Starts `opengyre up` stacks: listed in tests/_parallel.py (never two at once).

CLI = [sys.executable, "-m", "opengyre.cli"]


def og(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=env)


def _stack(data: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((data / "stack.json").read_text())


async def _publish_and_wait(data: Path, run: str) -> int:
    stack = _stack(data)
    log = await EventLog.connect(stack["nats_url"], credentials=read_nats_credentials(data, NATS_ADMIN))
    try:
        events = scripted_burst(11, run)
        await log.append_many(events)
        port = stack["services"]["synth"]["port"]
        async with grpc_channel(f"127.0.0.1:{port}", read_grpc_token(data)) as ch:
            stub = synth_pb2_grpc.SynthServiceStub(ch)
            for _ in range(600):
                st = await stub.GetStatus(common_pb2.StatusRequest(), timeout=60, wait_for_ready=True)
                if st.projections and all(p.pending == 0 for p in st.projections):
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("synth projections never caught up")
        return await log.last_seq()
    finally:
        await log.close()


def test_up_with_a_nats_url_that_does_not_answer_fails_fast(tmp_path: Path) -> None:
    port = free_port()  # nothing is started on it: only "nobody answers here" is needed
    res = og("up", "--data-dir", str(tmp_path), "--nats-url", f"nats://127.0.0.1:{port}", timeout=60)
    assert res.returncode == 2
    assert f"no NATS server answers at nats://127.0.0.1:{port}" in res.stdout
    assert not (tmp_path / "stack.json").exists()


def test_commands_that_need_a_stack_say_so(tmp_path: Path) -> None:
    res = og("status", "--data-dir", str(tmp_path))
    assert res.returncode == 1 and "no stack runs on" in res.stdout
    res = og("events", "tail", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "no event log in" in res.stdout
    res = og("replay", "-p", "no-such-projection", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "unknown projection 'no-such-projection'" in res.stdout
    res = og("up", "--services", "synth,warp-drive", "--data-dir", str(tmp_path))
    assert res.returncode == 2 and "unknown service(s) warp-drive" in res.stdout


@pytest.mark.slow  # five services up, down, up again (about a minute)
def test_a_fresh_data_dir_then_the_same_one_again_resumes(tmp_path: Path) -> None:
    data = tmp_path / "og"
    res = og("up", "--detach", "--data-dir", str(data))
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        st = _stack(data)
        assert set(st["services"]) == {"synth", "scheduler", "proxy", "trainer", "bench"}
        for name, info in st["services"].items():  # every service answers gRPC health
            with grpc.insecure_channel(f"127.0.0.1:{info['port']}") as ch:
                got = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
                assert got.status == health_pb2.HealthCheckResponse.SERVING, name
        assert og("up", "--detach", "--data-dir", str(data)).returncode == 2  # one stack per data dir
        first_last = asyncio.run(_publish_and_wait(data, "a"))
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 0 and "serving" in res.stdout and f"tasks {first_last}/0/" in res.stdout
    finally:
        assert og("down", "--data-dir", str(data)).returncode == 0
    assert not (data / "stack.json").exists()

    # Stack down: the log is still readable (a temporary server on the data dir's store).
    res = og("events", "show", "1", "--data-dir", str(data))
    assert res.returncode == 0 and "skill-ingested" in res.stdout
    res = og("replay", "-p", "tasks", "--until-seq", "30", "--data-dir", str(data))
    assert res.returncode == 0 and "up to seq 30" in res.stdout

    res = og("up", "--detach", "--data-dir", str(data))
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        second_last = asyncio.run(_publish_and_wait(data, "b"))
        assert second_last == 2 * first_last  # the same burst again, on the same stream
        res = og("replay", "-p", "tasks", "--data-dir", str(data))
        assert res.returncode == 0, res.stdout
        assert "matches the live projection" in res.stdout
        res = og("events", "tail", "-n", "3", "--data-dir", str(data))
        assert res.returncode == 0 and str(second_last) in res.stdout
        res = og("events", "show", "0", "--data-dir", str(data))
        assert res.returncode == 2 and "sequence numbers start at 1" in res.stdout
    finally:
        og("down", "--data-dir", str(data))


def test_ctrl_c_stops_the_stack_cleanly(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [*CLI, "up", "--data-dir", str(tmp_path), "--services", "synth"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:

        def up() -> bool:
            assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
            return (tmp_path / "stack.json").exists()

        wait_until(up, "the stack came up")
        child = _stack(tmp_path)["services"]["synth"]["pid"]
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out
    assert "stopped." in out
    assert not (tmp_path / "stack.json").exists()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)


def test_the_cli_loads_without_torch() -> None:
    """Every command imports the CLI and each service's commands; torch comes only with commands that use it."""
    code = "import sys, opengyre.cli; import opengyre.runtime as r; r.all_projections(); print(sorted(m for m in ('torch', 'transformers', 'megatron') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"


@pytest.mark.slow
def test_a_killed_service_is_restarted_and_its_projection_resumes(tmp_path: Path) -> None:
    data = tmp_path / "og"
    res = og("up", "--detach", "--data-dir", str(data), "--services", "synth")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        first = asyncio.run(_publish_and_wait(data, "a"))
        old = _stack(data)["services"]["synth"]
        os.kill(old["pid"], signal.SIGKILL)
        wait_until(
            lambda: _stack(data)["services"]["synth"]["pid"] != old["pid"], "the supervisor restarted the service"
        )
        new = _stack(data)["services"]["synth"]
        assert new["restarts"] == 1 and new["port"] == old["port"]
        second = asyncio.run(_publish_and_wait(data, "b"))  # waits on the restarted service's status
        assert second == 2 * first
        res = og("replay", "-p", "tasks", "--data-dir", str(data))
        assert res.returncode == 0 and "matches the live projection" in res.stdout, res.stdout
    finally:
        og("down", "--data-dir", str(data))
