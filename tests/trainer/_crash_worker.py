"""The real trainer service in a process of its own, for the crash tests (test_crash.py).

Usage: python _crash_worker.py DATA_DIR NATS_URL STREAM PREFIX BUCKET. It serves (``run_service``) with the data
dir's ``trainer.toml`` until the run's step 1 is published and folded, then stops: exit 0. With ``OPENGYRE_FAULT``
set the step is expected to SIGKILL the process first; reaching the end anyway exits 3 (the fault never fired).
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for ``tests._polling``


async def main() -> int:
    from opengyre.config import Settings
    from opengyre.eventlog import LogConfig
    from opengyre.runtime import run_service
    from opengyre.store import create_db_engine, migrate
    from opengyre.trainer import TrainerStore
    from opengyre.trainer.service import TrainerService
    from tests._polling import await_until

    data, url, stream, prefix, bucket = sys.argv[1:6]
    settings = Settings(
        data_dir=Path(data), nats_url=url, db_url=f"sqlite:///{Path(data) / 'db.sqlite'}",
        log=LogConfig(stream=stream, prefix=prefix, blob_bucket=bucket), ports={"trainer": 0},
    )  # fmt: skip
    engine = create_db_engine(settings.store_url("trainer"))
    migrate(engine)  # the service migrates too (a no-op then): the polling below may read before it does
    store = TrainerStore(engine)
    stop = asyncio.Event()
    served = asyncio.create_task(run_service(TrainerService(), settings, stop, port=0))

    def done() -> bool:
        latest = store.latest_weights("crash")
        return latest is not None and latest.step == 1 and not store.ready_groups(2)

    try:
        await await_until(done, "step 1 published and its executions consumed", polls=2400, every=0.1)
    finally:
        stop.set()
        await served
    return 3 if os.environ.get("OPENGYRE_FAULT") else 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
