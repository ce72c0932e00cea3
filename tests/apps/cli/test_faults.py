"""Issue 24's faults against a real stack: the whole data dir on a disk that fills, a corrupt projection file,
and a log byte limit that clients must not reset. Each counts acknowledged events against what the log and the
projections hold afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from opengyre.eventlog import EventLog, EventLogError
from opengyre.events import SkillIngested
from opengyre.runtime import alive

from ..._polling import await_until, wait_until
from ._cli import Ledger, applied_position, og, stack_record, synth_state
from .test_stack import SERVING, tmpfs, up

# Real stacks, each started twice or faulted for tens of seconds: listed in tests/_parallel.py's STACK_MODULES.
pytestmark = pytest.mark.slow


def _fill(disk: Path) -> Path:
    """Write to ``disk`` until it refuses: nothing on it can grow any more."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    chunk = b"\0" * 2**20
    try:
        while True:
            try:
                os.write(fd, chunk)
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]  # the last pages too
    finally:
        os.close(fd)
    return filler


async def test_a_full_disk_under_the_whole_data_dir_stops_nothing_and_the_stack_recovers(tmp_path: Path) -> None:
    """The default layout (log, stack.json, ports, logs, projections' SQLite all on one disk) on a 64 MiB tmpfs.
    Before issue 24 the supervisor died on the first stack.json it could not write, taking the stack with it."""
    with tmpfs(tmp_path / "disk", "size=64m") as disk:
        data = disk / "og"
        with up(data, env={"OPENGYRE_LOG_MIN_FREE_MB": "4"}) as record:
            url, monitor = str(record["nats_url"]), str(record["nats_monitor_url"])
            supervisor = int(record["pid"])  # type: ignore[call-overload]
            synth = int(record["services"]["synth"]["pid"])  # type: ignore[index]
            ledger = Ledger()
            log = await EventLog.connect(url, health_url=monitor, create=False, credentials=record["nats_admin"])
            try:
                await ledger.put(log, 20)
                filler = _fill(disk)
                said = await ledger.until_refused(log)
                assert "disk full?" in said, said
                # A service that dies now is restarted once there is room (a restart on a full disk would die too).
                # (It may be gone already: one clean-clone CI run found it so; what follows holds either way.)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(synth, signal.SIGKILL)
                wait_until(lambda: not alive(synth), "synth is gone")
                res = og("status", "--data-dir", str(data))
                assert res.returncode == 1 and "DOWN" in res.stdout and "disk is full" in res.stdout, res.stdout
                assert alive(supervisor), "the supervisor died of the full disk"

                filler.unlink()  # space returns: nats-server is restarted, synth too, appends go through again
                await ledger.put(log, 20)
            finally:
                await log.close()
            wait_until(
                lambda: stack_record(data)["services"]["synth"]["pid"] != synth and stack_record(data)["log"]["ok"],
                "the supervisor records synth restarted and the log healthy",
            )
            rec = stack_record(data)
            assert rec["pid"] == supervisor and rec["log"]["restarts"] == 1, rec
            assert rec["services"]["synth"]["restarts"] == 0, rec  # the disk's failure, not synth's: not counted
            await await_until(lambda: _serving(rec), "the restarted synth serves", every=0.2)
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 0, res.stdout
            await ledger.verify(data, url)  # every acknowledged event in the log once and applied once
            assert len(ledger.acked) >= 40


async def _serving(record: dict[str, object]) -> bool:
    try:
        return (await synth_state(record))[0] == SERVING
    except Exception:  # not listening yet
        return False


def _corrupt(path: Path) -> bytes:
    garbage = os.urandom(max(path.stat().st_size, 8192))
    path.write_bytes(garbage)
    return garbage


def _set_aside(path: Path) -> list[Path]:
    return sorted(p for p in path.parent.glob(f"{path.name}.corrupt-*") if not p.name.endswith(("-wal", "-shm")))


def _skills(db: Path) -> dict[str, int]:
    with contextlib.closing(sqlite3.connect(db)) as conn:
        return dict(conn.execute("SELECT skill_id, ingested_seq FROM synth_skills").fetchall())


def test_a_corrupt_projection_file_is_set_aside_and_rebuilt_by_up_and_by_projections_rebuild(tmp_path: Path) -> None:
    """Garbage over db/synth.db: `up` used to exit 2 with a traceback naming no file, and `projections rebuild`
    crashed too. Now the file is moved aside (kept) and the projections are folded from the log again."""
    data, ledger = tmp_path / "og", Ledger()
    db = data / "db" / "synth.db"
    with up(data) as record:
        asyncio.run(ledger.publish(str(record["nats_url"]), 30, credentials=record["nats_admin"]))
        wait_until(lambda: applied_position(data) >= 30, "synth applied the 30 skills")
    garbage = _corrupt(db)

    with up(data) as record:
        asyncio.run(ledger.verify(data, str(record["nats_url"])))  # rows == the log's fold, tracking 1..last
        assert _skills(db) == ledger.acked
    aside = _set_aside(db)
    assert len(aside) == 1 and aside[0].read_bytes() == garbage, aside

    garbage = _corrupt(db)
    res = og("projections", "rebuild", "tasks", "--data-dir", str(data))
    assert res.returncode == 0 and "rebuilt tasks from" in res.stdout, res.stdout + res.stderr
    assert _skills(db) == ledger.acked
    aside = _set_aside(db)
    assert len(aside) == 2 and garbage in [p.read_bytes() for p in aside], aside


async def test_a_log_limit_set_by_up_outlives_clients_and_status_says_when_it_is_full(tmp_path: Path) -> None:
    """OPENGYRE_LOG_MAX_BYTES given to `up`: a client connecting with the default config used to reset it to
    unlimited, and `status` said "ok" of a log that refused every append."""
    data, limit = tmp_path / "og", 64 * 1024
    with up(data, env={"OPENGYRE_LOG_MAX_BYTES": str(limit)}) as record:
        url = str(record["nats_url"])
        for create in (True, False):  # clients with the default LogConfig (no limit)
            client = await EventLog.connect(url, create=create, credentials=record["nats_admin"])
            await client.payloads.ensure()
            await client.close()
        res = og("events", "tail", "-n", "1", "--data-dir", str(data))  # a CLI client
        assert res.returncode == 0, res.stdout + res.stderr
        log = await EventLog.connect(url, create=False, credentials=record["nats_admin"])
        try:
            assert (await log.js.stream_info("OPENGYRE")).config.max_bytes == limit
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 0 and f"of {limit} B" in res.stdout, res.stdout

            acked = 0
            with pytest.raises(EventLogError, match="refused"):
                for i in range(10_000):
                    await log.append(SkillIngested(skill_id=f"s{i}", name=f"s{i}", description="d" * 512))
                    acked += 1
            res = og("status", "--data-dir", str(data))
            assert res.returncode == 1 and "FULL" in res.stdout and "appends are refused" in res.stdout, res.stdout
            usage = await log.usage()
            assert usage.full and usage.messages == acked > 0, usage  # discard "new": nothing dropped for room
        finally:
            await log.close()
