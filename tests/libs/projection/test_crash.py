"""SIGKILL a projection process mid-stream, restart it: no event lost, none applied twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from sqlalchemy import func, select

from opengyre.eventlog import EventLog
from opengyre.runtime import EmbeddedNats
from opengyre.store import Tracking, create_db_engine

from ..._polling import wait_until
from ._counting import counts, sample_events

HERE = Path(__file__).parent


def _spawn(nats: EmbeddedNats, log: EventLog, db_url: str) -> subprocess.Popen[bytes]:
    cfg = log.config
    return subprocess.Popen(
        [sys.executable, str(HERE / "_counter_main.py"), nats.url, cfg.stream, cfg.prefix, db_url],
        cwd=HERE,
        stderr=subprocess.PIPE,
    )


def _position(db_url: str) -> int:
    engine = create_db_engine(db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(Tracking)).scalar() or 0)
    except Exception:
        return 0
    finally:
        engine.dispose()


async def test_sigkill_mid_stream_loses_nothing_and_applies_nothing_twice(
    nats_server: EmbeddedNats, event_log: EventLog, tmp_path: Path
) -> None:
    db_url = f"sqlite:///{tmp_path / 'crash.db'}"
    events = sample_events(8000)  # 12,000 events
    await event_log.append_many(events)
    kills = 0
    proc = _spawn(nats_server, event_log, db_url)
    try:
        # Kill it three times at growing positions, each time mid-stream.
        for target in (1500, 5000, 9000):
            wait_until(
                lambda t=target: _position(db_url) >= t, f"the projector passed {target}", polls=2400, every=0.05
            )
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills += 1
            assert _position(db_url) < len(events)
            proc = _spawn(nats_server, event_log, db_url)
        wait_until(lambda: _position(db_url) >= len(events), "every event projected", polls=2400, every=0.05)
    finally:
        proc.terminate()
        proc.wait()
    assert kills == 3
    expected: dict[str, int] = {}
    for e in events:
        expected[e.aggregate_id()] = expected.get(e.aggregate_id(), 0) + 1
    engine = create_db_engine(db_url)
    with engine.connect() as c:
        got = {r.aggregate_id: r.n for r in c.execute(select(counts.c.aggregate_id, counts.c.n))}
        tracked = [r[0] for r in c.execute(select(Tracking.stream_seq).order_by(Tracking.stream_seq))]
    engine.dispose()
    assert got == expected
    assert tracked == list(range(1, len(events) + 1))
    assert os.path.exists(tmp_path / "crash.db")
