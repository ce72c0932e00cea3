"""The stack under faults: two `up` at once, a SIGKILLed supervisor, a killed nats-server, a log that goes away,
a full disk, taken ports, unusable data dirs. Each data test counts acknowledged against applied events."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from opengyre.eventlog import EventLog, LogConfig
from opengyre.runtime import EmbeddedNats, alive

from ..._polling import await_until, wait_until
from ._cli import CLI, Ledger, og, processes_on, stack_record, synth_state

# Each test starts real stacks and faults them (20-40 s each on an idle 2-core machine); listed in
# tests/_parallel.py (never two stacks at once).
pytestmark = pytest.mark.slow

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@contextlib.contextmanager
def up(
    data: Path, *args: str, services: str = "synth", env: dict[str, str] | None = None
) -> Iterator[dict[str, object]]:
    res = og("up", "--detach", "--data-dir", str(data), "--services", services, *args, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        yield stack_record(data)
    finally:
        og("down", "--data-dir", str(data))


@contextlib.contextmanager
def tmpfs(path: Path, *options: str) -> Iterator[Path]:
    """A small tmpfs: a disk that really fills, or a read-only one (mounting needs root; CI runs as root)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def test_two_ups_at_once_one_wins_and_the_other_starts_nothing(tmp_path: Path) -> None:
    data = tmp_path / "og"
    args = [*CLI, "up", "--data-dir", str(data), "--services", "synth"]
    env = {**os.environ, "COLUMNS": "200"}
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env) for _ in "ab"]
    try:
        wait_until(lambda: any(p.poll() is not None for p in procs), "one `up` gave up")
        loser = next(p for p in procs if p.poll() is not None)
        winner = next(p for p in procs if p is not loser)
        out = loser.stdout.read() if loser.stdout else ""
        assert loser.returncode == 2 and "is in use by" in out, out
        wait_until(lambda: (data / "stack.json").exists(), "the winner came up")
        record = stack_record(data)
        assert record["pid"] == winner.pid and winner.poll() is None
        running = sorted(what for _, what in processes_on(data))
        assert running == ["nats-server", "svc-synth"]  # one of each: the loser started nothing
        assert (data / "nats.url").read_text().strip() == record["nats_url"]
        ledger = Ledger()
        asyncio.run(ledger.publish(str(record["nats_url"]), 30, credentials=record["nats_admin"]))
        asyncio.run(ledger.verify(data, str(record["nats_url"])))
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
                p.wait(60)
    assert not processes_on(data)


def test_children_die_with_a_sigkilled_supervisor_and_leftovers_are_cleaned_up(tmp_path: Path) -> None:
    data = tmp_path / "og"
    ledger = Ledger()
    res = og("up", "--detach", "--data-dir", str(data), "--services", "synth")
    assert res.returncode == 0, res.stdout + res.stderr
    try:
        record = stack_record(data)
        asyncio.run(ledger.publish(str(record["nats_url"]), 20, credentials=record["nats_admin"]))
        os.kill(int(record["pid"]), signal.SIGKILL)
        wait_until(lambda: not processes_on(data), "nats-server and the service died with their supervisor")
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 1 and "no stack runs" in res.stdout, res.stdout

        # A process the parent-death signal cannot stop (stopped when its supervisor dies) is a leftover:
        # found, reported, and stopped by the next `up` before anything starts.
        res = og("up", "--detach", "--data-dir", str(data), "--services", "synth")
        assert res.returncode == 0, res.stdout + res.stderr
        record = stack_record(data)
        asyncio.run(ledger.publish(str(record["nats_url"]), 20, credentials=record["nats_admin"]))
        nats_pid, supervisor = int(record["nats_pid"]), int(record["pid"])  # type: ignore[call-overload]
        os.kill(nats_pid, signal.SIGSTOP)
        os.kill(supervisor, signal.SIGKILL)
        wait_until(lambda: not alive(supervisor), "the supervisor is gone")
        assert alive(nats_pid)
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 1 and f"nats-server (pid {nats_pid})" in res.stdout, res.stdout
        res = og("events", "tail", "--data-dir", str(data))  # no second nats-server on the same store
        assert res.returncode == 2 and "left" in res.stdout and f"pid {nats_pid}" in res.stdout, res.stdout
        res = og("up", "--detach", "--data-dir", str(data), "--services", "synth")
        assert res.returncode == 0, res.stdout + res.stderr
        assert "stopped what a stack that died had left running" in res.stdout and f"pid {nats_pid}" in res.stdout
        assert not alive(nats_pid)
        assert sorted(what for _, what in processes_on(data)) == ["nats-server", "svc-synth"]
        record = stack_record(data)
        asyncio.run(ledger.publish(str(record["nats_url"]), 20, credentials=record["nats_admin"]))
        asyncio.run(ledger.verify(data, str(record["nats_url"])))
        assert len(ledger.acked) == 60
    finally:
        og("down", "--data-dir", str(data))
    assert not processes_on(data)


async def _health_watch(port: int, seen: list[int]) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
        async for r in health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(service="")):
            seen.append(r.status)


def _went_down_and_back(seen: list[int]) -> bool:
    return NOT_SERVING in seen and SERVING in seen[seen.index(NOT_SERVING) :]


async def test_a_killed_nats_server_is_restarted_and_health_follows_the_log(tmp_path: Path) -> None:
    data = tmp_path / "og"
    with up(data, services="synth,scheduler") as record:
        # Each service keeps its projections in a SQLite file of its own (no two writers on one file).
        assert record["stores"] == {
            name: f"sqlite:///{data.resolve() / 'db' / f'{name}.db'}" for name in ("synth", "scheduler")
        }
        url, old_nats = str(record["nats_url"]), int(record["nats_pid"])  # type: ignore[call-overload]
        seen: list[int] = []
        watch = asyncio.create_task(_health_watch(int(record["services"]["synth"]["port"]), seen))  # type: ignore[index]
        ledger = Ledger()
        log = await EventLog.connect(url, credentials=record["nats_admin"])
        try:
            publisher = asyncio.create_task(ledger.put(log, 150))
            await await_until(lambda: len(ledger.acked) >= 30, "30 events acknowledged")
            os.kill(old_nats, signal.SIGKILL)  # mid-stream
            await publisher
        finally:
            await log.close()
        await await_until(lambda: _went_down_and_back(seen), "synth went NOT_SERVING, then SERVING again")
        watch.cancel()
        # The supervisor records the log's health on its own probe, after the service saw it back: wait for it.
        await await_until(lambda: stack_record(data)["log"]["ok"], "the stack record says the log is back")  # type: ignore[index]
        after = stack_record(data)
        assert after["log"] == {"ok": True, "reason": "", "restarts": 1}
        assert after["services"]["synth"]["restarts"] == 0  # type: ignore[index]  # it rode the restart out
        assert after["nats_url"] == url and after["nats_pid"] != old_nats  # same port, same store
        await ledger.verify(data, url)
        assert len(ledger.acked) == 150
    with sqlite3.connect(data / "db" / "scheduler.db") as db:
        assert db.execute("SELECT COUNT(*) FROM synth_skills").fetchone() == (0,)  # synth's rows are in synth.db
        assert {p for (p,) in db.execute("SELECT DISTINCT projection FROM og_tracking")} <= {"scheduler"}
    assert not (data / "opengyre.db").exists()


async def _not_serving(record: dict[str, object]) -> bool:
    return (await synth_state(record))[0] == NOT_SERVING


def _health(record: dict[str, object]) -> int:
    return asyncio.run(synth_state(record))[0]


def test_status_says_when_the_log_is_down_and_services_stop_serving(tmp_path: Path) -> None:
    nats = EmbeddedNats(tmp_path / "external")
    nats.start()
    data = tmp_path / "og"
    try:
        with up(data, "--nats-url", nats.url) as record:
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 0 and "event log" in res.stdout and "serving" in res.stdout, res.stdout
            ledger = Ledger()
            asyncio.run(ledger.publish(str(record["nats_url"]), 20, credentials=record["nats_admin"]))
            nats.stop()  # not ours to restart: the stack must say so
            wait_until(lambda: _health(record) == NOT_SERVING, "synth reports NOT_SERVING without its log")
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 1 and "DOWN" in res.stdout and "no NATS server answers" in res.stdout, res.stdout
            assert "not serving" in res.stdout
            nats = EmbeddedNats(tmp_path / "external", port=nats.port)
            nats.start()
            wait_until(lambda: _health(record) == SERVING, "synth serves again once the log is back")
            asyncio.run(ledger.publish(str(record["nats_url"]), 20, credentials=record["nats_admin"]))
            asyncio.run(ledger.verify(data, str(record["nats_url"])))
    finally:
        nats.stop()


async def test_a_full_disk_is_reported_and_the_stack_recovers_when_space_returns(tmp_path: Path) -> None:
    data = tmp_path / "og"
    with tmpfs(data / "nats", "size=16m") as store, up(data, env={"OPENGYRE_LOG_MIN_FREE_MB": "4"}) as record:
        url, monitor = str(record["nats_url"]), str(record["nats_monitor_url"])
        ledger = Ledger()
        log = await EventLog.connect(url, health_url=monitor, credentials=record["nats_admin"])
        try:
            await ledger.put(log, 20)
            filler = store / "filler"
            filler.write_bytes(b"\0" * (shutil.disk_usage(store).free - 256 * 1024))
            said = await ledger.until_refused(log)
            assert "storage failed a write (disk full?)" in said, said
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 1 and "DOWN" in res.stdout and "disk full?" in res.stdout, res.stdout
            res = og("events", "tail", "-n", "1", "--data-dir", str(data))
            assert res.returncode == 0, res.stdout  # reading still works

            await await_until(lambda: _not_serving(record), "synth: NOT_SERVING while the log cannot store", every=0.2)
            filler.unlink()  # space returns: the supervisor restarts nats-server, appends go through again
            await ledger.put(log, 20)
        finally:
            await log.close()
        assert stack_record(data)["log"]["restarts"] == 1  # type: ignore[index]
        assert stack_record(data)["services"]["synth"]["restarts"] == 0  # type: ignore[index]
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 0, res.stdout
        await ledger.verify(data, url)
        assert len(ledger.acked) > 40


def test_a_taken_port_or_an_unusable_data_dir_is_a_clear_error(tmp_path: Path) -> None:
    data = tmp_path / "og"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        res = og("up", "--data-dir", str(data), "--services", "synth", env={"OPENGYRE_SYNTH_PORT": str(port)})
    assert res.returncode == 2, res.stdout + res.stderr
    assert f"port {port} of svc-synth (OPENGYRE_SYNTH_PORT) is in use" in res.stdout
    assert not processes_on(data) and not (data / "nats").exists()  # checked before anything started

    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with tmpfs(tmp_path / "ro", "size=1m", "ro") as ro:
        cases = [
            (["up"], a_file, "is not a directory"),
            (["up", "--detach"], a_file / "og", f"cannot create data dir {a_file / 'og'}"),
            (["up"], ro, "is not writable: read-only file system"),
            (["db", "migrate"], ro / "og", "Read-only file system"),
        ]
        for cmd, where, said in cases:
            res = og(*cmd, "--data-dir", str(where))
            out = res.stdout + res.stderr
            assert res.returncode == 2 and said in " ".join(out.split()), (cmd, where, out)
            assert "Traceback" not in out
    res = og("replay", "-p", "tasks", "--data-dir", str(tmp_path / "missing"))
    assert res.returncode == 2 and "no projection store in" in res.stdout, res.stdout


def _applied(record: dict[str, object], n: int) -> bool:
    return asyncio.run(synth_state(record))[1:] == (n, 0)


def test_commands_read_the_store_and_stream_the_stack_recorded(tmp_path: Path, prod_db_url: str) -> None:
    """Before: `replay` on a PostgreSQL stack read an empty SQLite file, and the stream was an env variable."""
    data = tmp_path / "og"
    config = LogConfig(stream="RECORDED")
    with up(data, "--db-url", prod_db_url, "--stream", "RECORDED") as record:
        ledger = Ledger()
        asyncio.run(ledger.publish(str(record["nats_url"]), 25, config, credentials=record["nats_admin"]))
        wait_until(lambda: _applied(record, 25), "synth applied 25 events")
    assert not (data / "db").exists()  # everything went to the store given
    # No option repeated: the store and the stream are what `up` recorded.
    res = og("replay", "-p", "tasks", "--data-dir", str(data))
    assert res.returncode == 0 and "25 events" in res.stdout and "matches the live projection" in res.stdout, res.stdout
    res = og("events", "tail", "-n", "1", "--data-dir", str(data))
    assert res.returncode == 0 and "skill-ingested" in res.stdout, res.stdout
    res = og("projections", "list", "--data-dir", str(data))
    assert res.returncode == 0 and "synth" in res.stdout, res.stdout
    # And the next `up` resumes the same stack (same stream, same store) without options.
    with up(data) as record:
        assert record["stream"] == "RECORDED"
        ledger2 = Ledger()
        asyncio.run(ledger2.publish(str(record["nats_url"]), 5, config, credentials=record["nats_admin"]))
        wait_until(lambda: _applied(record, 30), "synth applied 30 events")


def test_status_shows_the_pid_of_the_running_service_not_a_killed_one(tmp_path: Path) -> None:
    """A SIGKILLed service: until the supervisor restarts it, status says it exited (not its dead pid as if it
    ran); after, the new pid and the restart."""
    data = tmp_path / "og"
    with up(data) as record:
        old = int(record["services"]["synth"]["pid"])  # type: ignore[index]
        supervisor = int(record["pid"])  # type: ignore[call-overload]
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 0 and str(old) in res.stdout, res.stdout
        os.kill(supervisor, signal.SIGSTOP)  # holds the restart back, so the window is there to look at
        try:
            os.kill(old, signal.SIGKILL)
            wait_until(lambda: not alive(old), "the killed service is gone")
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 1 and "exited" in res.stdout and str(old) not in res.stdout, res.stdout
        finally:
            os.kill(supervisor, signal.SIGCONT)
        wait_until(lambda: stack_record(data)["services"]["synth"]["restarts"] == 1, "the supervisor restarted it")
        new = int(stack_record(data)["services"]["synth"]["pid"])
        wait_until(lambda: _serving_now(data), "the restarted synth serves")
        res = og("status", "--data-dir", str(data))
        assert res.returncode == 0 and f"{new} (1 restarts)" in res.stdout and str(old) not in res.stdout, res.stdout


def _serving_now(data: Path) -> bool:
    try:
        return _health(stack_record(data)) == SERVING
    except grpc.aio.AioRpcError:  # not listening yet
        return False


def test_status_says_what_is_exposed_and_host_is_recorded(tmp_path: Path) -> None:
    """Per service its address and that a call without the token is refused; NATS requires credentials and names
    its users; --host (a loopback address other than the default here: only loopback may be a target) is recorded
    and kept by the next `up`, for gRPC and the proxy's gateway alike."""
    data = tmp_path / "og"
    env = {"COLUMNS": "250"}
    limit = {"OPENGYRE_HTTP_MAX_BODY_BYTES": str(8 << 20)}  # `up`'s, not `status`'s: the stack records its own
    with up(data, "--host", "127.0.0.2", services="synth,proxy", env={**env, **limit}) as record:
        assert record["host"] == "127.0.0.2"
        assert (data / "proxy.url").read_text().startswith("http://127.0.0.2:")
        res = og("status", "--data-dir", str(data), env=env)
        assert res.returncode == 0, res.stdout
        for name in ("synth", "proxy"):
            port = record["services"][name]["port"]  # type: ignore[index]
            row = next(line for line in res.stdout.splitlines() if f"127.0.0.2:{port}" in line)
            assert name in row and "token" in row and "OPEN" not in row, row
        said = next(line for line in res.stdout.splitlines() if line.startswith("NATS requires credentials; users: "))
        users = said.removeprefix("NATS requires credentials; users: ").split(" (")[0].split(", ")
        assert sorted(users) == sorted(["admin", "synth", "scheduler", "proxy", "trainer", "bench"]), said
        assert "listen on 127.0.0.2 (this machine only)" in res.stdout
        limits = next(line for line in res.stdout.splitlines() if line.startswith("HTTP limits"))
        assert "body 8 MiB" in limits and "head 32 KiB in at most 100 lines within 10 s" in limits, limits
        # ... and the gateway serves within them: 9 MiB is refused before it is read, in the dialect's shape.
        gateway = (data / "proxy.url").read_text().strip()
        big = httpx.post(f"{gateway}/v1/chat/completions", content=b"x" * (9 << 20), headers={"x-api-key": "k"})
        assert big.status_code == 413 and big.json()["error"]["type"] == "request_too_large", big.text
    assert json.loads((data / "settings.json").read_text())["host"] == "127.0.0.2"
    with up(data, env=env) as record:  # no --host: the recorded one
        assert record["host"] == "127.0.0.2"
