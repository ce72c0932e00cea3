"""`opengyre replay` compares a scratch SQLite replay with the live store, also when the live store is PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path

from sqlalchemy import Engine

from opengyre.cli._replay import replay_compare
from opengyre.config import Settings
from opengyre.eventlog import EventLog
from opengyre.projection import ProjectionRunner
from opengyre.runtime import all_projections

from ..._burst import scripted_burst


async def test_replay_matches_the_live_store_of_either_dialect(
    event_log: EventLog, any_engine: Engine, any_db_url: str, tmp_path: Path
) -> None:
    await event_log.append_many(scripted_burst(5, "r"))
    projections = list(all_projections().values())
    stop = asyncio.Event()
    runners = [ProjectionRunner(p, event_log, any_engine) for p in projections]
    tasks = [asyncio.create_task(r.run(stop)) for r in runners]
    try:
        for r in runners:
            await r.wait_caught_up(60)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    settings = Settings(data_dir=tmp_path, db_url=any_db_url, log=event_log.config)
    for p in projections:
        rows, same, n = await replay_compare(p, event_log, settings, None)
        assert n > 0 and any(rows.values()), p.name
        assert same is True, p.name
        _, earlier, _ = await replay_compare(p, event_log, settings, 3)
        assert earlier is None  # an earlier point is shown, not compared
