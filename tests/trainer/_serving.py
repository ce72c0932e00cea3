"""The TrainerService run as the stack runs it, for tests that talk to it over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from opengyre.config import Settings
from opengyre.runtime import grpc_channel, run_service
from opengyre.trainer.service import TrainerService
from opengyre.v1 import common_pb2, trainer_pb2_grpc

from .._polling import await_until


@contextlib.asynccontextmanager
async def serving_trainer(settings: Settings) -> AsyncIterator[trainer_pb2_grpc.TrainerServiceStub]:
    """A stub to a running trainer service whose projection has caught up with the log."""
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(TrainerService(), settings, stop, port=0, ready=ready))
    try:
        port = await asyncio.wait_for(ready, 60)
        async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
            stub = trainer_pb2_grpc.TrainerServiceStub(ch)

            async def caught_up() -> bool:
                st = await stub.GetStatus(common_pb2.StatusRequest())
                return all(p.pending == 0 for p in st.projections) and bool(st.projections)

            await await_until(caught_up, "the trainer caught up", polls=300, every=0.1)
            yield stub
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)  # a training loop ends its step first
