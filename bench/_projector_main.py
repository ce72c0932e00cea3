"""A projector process for the benchmark: ``ours`` (ProjectionRunner) or ``naive`` (nats-py fetch, one
transaction and one synchronous ack per event) — the baseline the figures are a ratio against."""

from __future__ import annotations

import asyncio
import sys

import nats
from _bench_projection import ExecutionStats, metadata
from nats.js.api import AckPolicy, ConsumerConfig
from sqlalchemy import insert

from opengyre.eventlog import EventLog, LogConfig
from opengyre.projection import ProjectionRunner
from opengyre.store import Tracking, create_db_engine, migrate


async def ours(url: str, stream: str, prefix: str, db_url: str) -> None:
    log = await EventLog.connect(url, LogConfig(stream=stream, prefix=prefix, blob_bucket=f"B{stream}"))
    engine = create_db_engine(db_url)
    migrate(engine)
    metadata.create_all(engine)
    await ProjectionRunner(ExecutionStats(), log, engine, batch=2000).run()


async def naive(url: str, stream: str, prefix: str, db_url: str) -> None:
    log = await EventLog.connect(url, LogConfig(stream=stream, prefix=prefix, blob_bucket=f"B{stream}"))
    engine = create_db_engine(db_url)
    migrate(engine)
    metadata.create_all(engine)
    proj = ExecutionStats()
    nc = await nats.connect(url)
    js = nc.jetstream()
    sub = await js.pull_subscribe(
        f"{prefix}.>", durable="naive", stream=stream, config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT)
    )
    while True:
        try:
            msgs = await sub.fetch(batch=100, timeout=1)
        except nats.errors.TimeoutError:
            continue
        for m in msgs:
            s = log.to_stored_inline(m)
            event = log.decode(s)
            with engine.begin() as tx:
                proj.apply(tx, event, s.seq)
                tx.execute(insert(Tracking).values(projection=proj.name, stream_seq=s.seq))
            await m.ack_sync()


if __name__ == "__main__":
    mode, *args = sys.argv[1:]
    asyncio.run({"ours": ours, "naive": naive}[mode](*args))
