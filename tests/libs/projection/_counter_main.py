"""Run the counting projection as its own process (the crash test kills it with SIGKILL)."""

from __future__ import annotations

import asyncio
import sys

from _counting import CountingProjection, metadata

from opengyre.eventlog import EventLog, LogConfig
from opengyre.projection import ProjectionRunner
from opengyre.store import create_db_engine, migrate


async def main(url: str, stream: str, prefix: str, db_url: str) -> None:
    log = await EventLog.connect(url, LogConfig(stream=stream, prefix=prefix, blob_bucket=f"B{stream}"))
    engine = create_db_engine(db_url)
    migrate(engine)
    metadata.create_all(engine)
    runner = ProjectionRunner(CountingProjection(), log, engine, batch=50)
    await runner.run()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
