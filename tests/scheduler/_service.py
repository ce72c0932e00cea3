"""Run real services (gRPC, projection runners, background work) in the test's event loop."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from opengyre.config import GRPC_TOKEN_ENV, Settings
from opengyre.eventlog import LogConfig
from opengyre.runtime import EmbeddedNats, Service, grpc_channel, run_service
from opengyre.scheduler.service import SchedulerService
from opengyre.v1 import scheduler_pb2_grpc

# The gRPC token of every service these helpers run (each keeps a data dir of its own, a stack shares one), and
# the environment that hands it to the processes a cell's actuator starts (its trainer worker calls the scheduler).
TOKEN = "test-token-of-the-scheduler-tests"
TOKEN_ENV = {GRPC_TOKEN_ENV: TOKEN}


@contextlib.asynccontextmanager
async def running_service(
    service: Service, nats: EmbeddedNats, log_config: LogConfig, tmp: Path, *, port: int = 0
) -> AsyncIterator[int]:
    """Yield the gRPC port; each service keeps its own SQLite store, as separate processes would."""
    tmp.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{tmp / f'{service.name}.db'}"
    settings = Settings(data_dir=tmp, nats_url=nats.url, db_url=db, log=log_config, grpc_token_override=TOKEN)
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(service, settings, stop, port=port, ready=ready))
    done, _ = await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()  # raises why it could not start
    try:
        yield ready.result()
    finally:
        stop.set()
        await task


@contextlib.asynccontextmanager
async def running_scheduler(
    service: SchedulerService, nats: EmbeddedNats, log_config: LogConfig, tmp: Path, *, port: int = 0
) -> AsyncIterator[tuple[scheduler_pb2_grpc.SchedulerServiceStub, int]]:
    async with running_service(service, nats, log_config, tmp, port=port) as port:
        channel = grpc_channel(f"127.0.0.1:{port}", TOKEN)
        try:
            yield scheduler_pb2_grpc.SchedulerServiceStub(channel), port
        finally:
            await channel.close()
