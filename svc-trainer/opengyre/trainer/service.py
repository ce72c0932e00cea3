"""The trainer service process: gRPC TrainerService with health and reflection, its projection, and, when the
data dir holds a ``trainer.toml``, the online training loop (``opengyre up`` then trains as data arrives)."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import grpc

from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import trainer_pb2_grpc

from ._config import TrainerConfig
from ._grpc import TrainerServicer
from ._projection import TrainerProjection
from ._retention import RetentionPolicy, retention_loop
from ._store import TrainerStore

if TYPE_CHECKING:
    from ._loop import OnlineTrainer

__all__ = ["CONFIG_FILE", "TrainerService"]

CONFIG_FILE = "trainer.toml"

log = logging.getLogger(__name__)


def _report_crash(task: asyncio.Task[int]) -> None:
    # A failed step stops the loop (it never retries past a half-published update); a restart of the service
    # resumes from the run's latest published weights. Say so loudly instead of going quiet.
    if not task.cancelled() and task.exception() is not None:
        log.error("trainer: the training loop stopped", exc_info=task.exception())


class TrainerService(Service):
    name = "trainer"
    summary = "QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, weight publishing"
    capabilities = (
        "status",
        "executions",
        "ready-groups",
        "steps",
        "weights",
        "sample-preview",
        "score",
        "online-training",
    )
    not_implemented = ()

    def __init__(self, retention: RetentionPolicy | None = None) -> None:
        self._stop = asyncio.Event()
        self._task: asyncio.Task[int] | None = None
        self._trainer: OnlineTrainer | None = None
        self._retention = retention
        self._compactor: asyncio.Task[None] | None = None

    def projections(self) -> Sequence[Projection]:
        return [TrainerProjection()]

    async def notes(self, ctx: ServiceContext) -> Sequence[str]:
        held = await asyncio.to_thread(TrainerStore(ctx.engine).awaiting_calls)
        if not held:
            return ()
        shown = ", ".join(f"{h.execution_id} ({h.applied} of {h.recorded})" for h in held[:5])
        more = f" and {len(held) - 5} more" if len(held) > 5 else ""
        return (
            f"{len(held)} finished executions held out of training: their finish counted calls the trainer has not"
            f" received yet (applied of recorded): {shown}{more}",
        )

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(self, ctx, lambda: self._trainer), server)
        return ("opengyre.v1.TrainerService",)

    async def start(self, ctx: ServiceContext) -> None:
        self._stop.clear()
        # Retention runs whether or not this process trains: it follows the steps the log records.
        policy = self._retention or RetentionPolicy.from_env()
        self._compactor = asyncio.create_task(
            retention_loop(TrainerStore(ctx.engine), ctx.log, policy, self._stop), name="trainer-retention"
        )
        path = ctx.settings.data_dir / CONFIG_FILE
        if not path.exists():
            log.info("trainer: no %s in %s, serving without training", CONFIG_FILE, ctx.settings.data_dir)
            return
        config = TrainerConfig.from_toml(path)
        config.validate()  # a bad trainer.toml still fails the start, before the wait below
        self._task = asyncio.create_task(self._train(ctx, config), name="trainer-loop")
        self._task.add_done_callback(_report_crash)

    async def _train(self, ctx: ServiceContext, config: TrainerConfig) -> int:
        from ._loop import OnlineTrainer  # torch: only when this process trains

        # The trainer resumes from what its projection says (the last step, the latest weights, the ready
        # groups): after a crash mid-step the log holds events the store has not folded yet (a step completed,
        # its weights published), and a trainer built before they are folded trains that step again.
        runner = ctx.runners.get(TrainerProjection.name)
        if runner is not None:
            await runner.wait_caught_up(math.inf)
        trainer = await asyncio.to_thread(OnlineTrainer, config, TrainerStore(ctx.engine), ctx.log)
        if config.metrics_port is not None:
            log.info("trainer: /metrics on port %d", trainer.serve_metrics())
        self._trainer = trainer
        log.info("trainer: training run %s (%s, %s)", config.run_id, config.backend, config.algorithm)
        return await trainer.run(self._stop)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None and self._trainer is None:
            self._task.cancel()  # still waiting for its projection: nothing trained, nothing to finish
        for task in (self._task, self._compactor):
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
        self._task = self._compactor = None
        if self._trainer is not None:
            self._trainer.close()
            self._trainer = None
