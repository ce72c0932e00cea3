"""Driving the `opengyre` CLI as a user does, and counting events acknowledged against events applied."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpc_health.v1 import health_pb2, health_pb2_grpc

from opengyre.config import read_grpc_token
from opengyre.eventlog import EventLog, LogConfig, LogUnavailable, NatsCredentials
from opengyre.events import SkillIngested
from opengyre.runtime import NATS_ADMIN, cmdline, grpc_channel, read_nats_credentials
from opengyre.v1 import common_pb2, synth_pb2_grpc

from ..._polling import await_until

CLI = [sys.executable, "-m", "opengyre.cli"]


def og(*args: str, timeout: float = 180, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    # Wide enough that rich never wraps a message the test looks for (data dir paths are long).
    full = {**os.environ, "COLUMNS": "4000", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, env=full)


def stack_record(data: Path) -> dict[str, Any]:
    """The stack's record, with what a client of the stack needs, read from the data dir as a CLI command does:
    ``grpc_token`` and ``nats_admin`` (the embedded log's admin user)."""
    record: dict[str, Any] = json.loads((data / "stack.json").read_text())
    record["grpc_token"] = read_grpc_token(data)
    record["nats_admin"] = read_nats_credentials(data, NATS_ADMIN)
    return record


def processes_on(data: Path) -> list[tuple[int, str]]:
    """Every live nats-server serving ``data``'s store and every service started for ``data``."""
    store, root = str((data / "nats").resolve()), str(data.resolve())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        argv = cmdline(int(entry.name)) or []
        if argv and Path(argv[0]).name == "nats-server" and store in argv:
            found.append((int(entry.name), "nats-server"))
        elif "service" in argv and "--data-dir" in argv and root in argv:
            found.append((int(entry.name), f"svc-{argv[argv.index('run') + 1]}"))
    return found


@dataclass
class Ledger:
    """Skills appended one by one, each retried with the same event (so the same id) until acknowledged: what a
    careful client does. ``verify`` then checks that every acknowledged one is in the stream exactly once and
    applied exactly once by synth's projection, and nothing else is."""

    acked: dict[str, int] = field(default_factory=dict)  # skill id -> stream sequence of its ack
    refusals: list[str] = field(default_factory=list)  # what failed appends said
    pending: SkillIngested | None = None  # refused, to be retried as is

    def event(self) -> SkillIngested:
        sid = f"skill-{uuid.uuid4().hex[:12]}"
        return SkillIngested(skill_id=sid, name=sid[:20], description="d" * 512)

    async def append(self, log: EventLog, event: SkillIngested) -> bool:
        try:
            got = await log.append(event)
        except LogUnavailable as exc:
            self.refusals.append(str(exc))
            self.pending = event
            return False
        self.acked[event.skill_id] = got.seq
        self.pending = None
        return True

    async def put(self, log: EventLog, n: int, retries: int = 100) -> None:
        """The refused event if any, then ``n`` new ones; each retried until acknowledged."""
        events = ([self.pending] if self.pending else []) + [self.event() for _ in range(n)]
        for event in events:
            for _ in range(retries):
                if await self.append(log, event):
                    break
            else:
                raise AssertionError(f"{event.skill_id} never acknowledged: {self.refusals[-1:]}")

    async def until_refused(self, log: EventLog, limit: int = 100_000) -> str:
        """New events until the log refuses one (kept as ``pending``); what it said."""
        for _ in range(limit):
            if not await self.append(log, self.event()):
                return self.refusals[-1]
        raise AssertionError(f"the log took {limit} events without refusing one")

    async def publish(
        self, url: str, n: int, config: LogConfig | None = None, *, credentials: NatsCredentials | None
    ) -> None:
        log = await EventLog.connect(url, config, credentials=credentials)
        try:
            await self.put(log, n)
        finally:
            await log.close()

    async def verify(self, data: Path, url: str, config: LogConfig | None = None) -> None:
        """Acknowledged == in the stream once == applied once."""
        log = await EventLog.connect(url, config, create=False, credentials=read_nats_credentials(data, NATS_ADMIN))
        try:
            last = await log.last_seq()
            in_stream: dict[str, list[int]] = {}
            async for stored in log.read(1, last):
                in_stream.setdefault(json.loads(stored.body)["skill_id"], []).append(stored.seq)
        finally:
            await log.close()
        await await_until(lambda: applied_position(data) >= last, f"synth applied up to seq {last}", polls=1200)
        lost = set(self.acked) - set(in_stream)
        doubled = {k: v for k, v in in_stream.items() if len(v) > 1}
        assert not lost, f"acknowledged but not in the stream: {sorted(lost)[:5]}"
        assert not doubled, f"stored twice: {list(doubled.items())[:5]}"
        assert {k: v[0] for k, v in in_stream.items() if k in self.acked} == self.acked
        # closing(): sqlite3's own ``with`` only commits, and a connection left open for the collector checkpoints
        # the WAL into the file whenever it is collected (over what a test wrote there meanwhile).
        with contextlib.closing(sqlite3.connect(data / "db" / "synth.db")) as db:
            rows = dict(db.execute("SELECT skill_id, ingested_seq FROM synth_skills").fetchall())
            tracked = [s for (s,) in db.execute("SELECT stream_seq FROM og_tracking WHERE projection = 'tasks'")]
        assert {k: rows.get(k) for k in self.acked} == self.acked, "an acknowledged skill was not applied"
        assert sorted(tracked) == list(range(1, last + 1)), "the projection skipped or repeated a position"


async def synth_state(record: dict[str, Any]) -> tuple[int, int, int]:
    """synth's gRPC health, and its projection's (position, pending) when it serves (else -1, -1)."""
    port = record["services"]["synth"]["port"]
    async with grpc_channel(f"127.0.0.1:{port}", record["grpc_token"]) as ch:
        h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
        if h.status != health_pb2.HealthCheckResponse.SERVING:
            return h.status, -1, -1
        st = await synth_pb2_grpc.SynthServiceStub(ch).GetStatus(common_pb2.StatusRequest(), timeout=10)
    return h.status, st.projections[0].position, st.projections[0].pending


def applied_position(data: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(data / "db" / "synth.db", timeout=10)) as db:
            (pos,) = db.execute(
                "SELECT COALESCE(MAX(stream_seq), 0) FROM og_tracking WHERE projection = 'tasks'"
            ).fetchone()
    except sqlite3.OperationalError:  # not migrated yet
        return 0
    return int(pos)
