"""Event backbone benchmark: events/s published and projected end to end, and a 1M-event rebuild.

Each figure is printed next to a baseline measured in the same run: plain nats-py publishes (one awaited
PubAck at a time) and a naive projector (nats-py fetch, one transaction and one synchronous ack per event).

    .venv/bin/python bench/eventlog_bench.py                 # 100k end to end, 1M rebuild
    .venv/bin/python bench/eventlog_bench.py --events 20000 --rebuild-events 100000   # quick
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _bench_projection import ExecutionStats, metadata
from sqlalchemy import func, select

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionFinished
from opengyre.projection import rebuild
from opengyre.runtime import EmbeddedNats
from opengyre.store import Tracking, create_db_engine, migrate

HERE = Path(__file__).parent


def small_events(n: int, tag: str) -> list[ExecutionFinished]:
    return [
        ExecutionFinished(execution_id=f"{tag}{i % 5000}", status="completed", score=(i % 100) / 100) for i in range(n)
    ]


def tracked(db_url: str) -> int:
    engine = create_db_engine(db_url)
    try:
        with engine.connect() as c:
            return int(c.execute(select(func.count()).select_from(Tracking)).scalar() or 0)
    except Exception:
        return 0
    finally:
        engine.dispose()


async def publish_rates(url: str, n: int) -> tuple[float, float]:
    cfg = LogConfig(stream="BENCHPUB", prefix="benchpub.ev", blob_bucket="BBENCHPUB")
    log = await EventLog.connect(url, cfg)
    try:
        base_n = max(2000, n // 10)
        events = small_events(base_n, "b")
        t = time.perf_counter()
        for e in events:  # baseline: nats-py's js.publish, one awaited PubAck at a time
            body = log.registry.encode(e)
            await log.js.publish(
                log.subject_for(e), body, headers={"Nats-Msg-Id": e.event_id, "Og-Type": e.type_name()}
            )
        baseline = base_n / (time.perf_counter() - t)
        events = small_events(n, "o")
        t = time.perf_counter()
        await log.append_many(events)
        ours = n / (time.perf_counter() - t)
        await log.js.delete_stream(cfg.stream)
        return ours, baseline
    finally:
        await log.close()


async def end_to_end(url: str, n: int, mode: str, tmp: Path) -> float:
    """Events/s from the first publish until a separate projector process has committed the last one."""
    cfg = LogConfig(stream=f"BENCHE2E{mode.upper()}", prefix=f"bench{mode}.ev", blob_bucket=f"B{mode}")
    log = await EventLog.connect(url, cfg)
    db_url = f"sqlite:///{tmp / f'e2e-{mode}.db'}"
    proc = subprocess.Popen(
        [sys.executable, str(HERE / "_projector_main.py"), mode, url, cfg.stream, cfg.prefix, db_url], cwd=HERE
    )
    try:
        while tracked(db_url) == 0 and not Path(db_url[10:]).exists():
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # let the projector import, migrate and subscribe
        events = small_events(n, "e")
        t = time.perf_counter()
        await log.append_many(events)
        while tracked(db_url) < n:
            await asyncio.sleep(0.02)
        rate = n / (time.perf_counter() - t)
    finally:
        proc.terminate()
        proc.wait()
        await log.js.delete_stream(cfg.stream)
        await log.close()
    return rate


async def rebuild_time(url: str, n: int, tmp: Path) -> tuple[float, float]:
    cfg = LogConfig(stream="BENCHREBUILD", prefix="benchrb.ev", blob_bucket="BBENCHRB")
    log = await EventLog.connect(url, cfg)
    engine = create_db_engine(f"sqlite:///{tmp / 'rebuild.db'}")
    migrate(engine)
    metadata.create_all(engine)
    try:
        chunk = 50_000
        t = time.perf_counter()
        for i in range(0, n, chunk):
            await log.append_many(small_events(min(chunk, n - i), f"r{i // chunk}-"))
        publish_s = time.perf_counter() - t
        t = time.perf_counter()
        applied = await rebuild(ExecutionStats(), log, engine)
        rebuild_s = time.perf_counter() - t
        assert applied == n, (applied, n)
        await log.js.delete_stream(cfg.stream)
        return rebuild_s, publish_s
    finally:
        engine.dispose()
        await log.close()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--events", type=int, default=100_000, help="events published and projected end to end")
    ap.add_argument("--rebuild-events", type=int, default=1_000_000, help="events in the rebuild test")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with EmbeddedNats(tmp / "nats") as nats_server:
            url = nats_server.url
            ours_pub, base_pub = await publish_rates(url, args.events)
            print(
                f"publish      : {ours_pub:>9,.0f} events/s (baseline nats-py js.publish {base_pub:,.0f}/s, x{ours_pub / base_pub:.1f})"
            )
            naive_n = max(2000, args.events // 10)
            base_e2e = await end_to_end(url, naive_n, "naive", tmp)
            ours_e2e = await end_to_end(url, args.events, "ours", tmp)
            print(
                f"end to end   : {ours_e2e:>9,.0f} events/s published and projected (baseline naive projector {base_e2e:,.0f}/s, x{ours_e2e / base_e2e:.1f})"
            )
            rebuild_s, publish_s = await rebuild_time(url, args.rebuild_events, tmp)
            print(
                f"rebuild      : {args.rebuild_events:,} events in {rebuild_s:.1f} s ({args.rebuild_events / rebuild_s:,.0f}/s; publishing them took {publish_s:.1f} s)"
            )


if __name__ == "__main__":
    asyncio.run(main())
