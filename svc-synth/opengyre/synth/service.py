"""The synth service process: gRPC SynthService with health and reflection, and the hardening worker.

The worker folds nothing itself: it polls the hardening projection's rows for versions flagged too easy and
appends what the pipeline decides (task-too-easy, task-hardened, task-validated), with ids derived from the task
version so a repeated step after a restart appends nothing twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import grpc
from sqlalchemy import select

from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, synth_pb2, synth_pb2_grpc

from ._hardening import HardeningProjection
from ._llm import LlmConfig
from ._pipeline import Synthesizer, TaskBuild
from ._synth import check_choice
from ._tasks import SkillRow, TaskRow, TasksProjection, current_tasks, task_lineage

__all__ = ["SynthService"]

_log = logging.getLogger(__name__)
_S = SkillRow.__table__
_T = TaskRow.__table__


def _verdicts(b: TaskBuild) -> synth_pb2.TaskVerdicts:
    return synth_pb2.TaskVerdicts(
        task_id=b.blueprint.task_id,
        version=b.blueprint.version,
        ok=b.ok,
        gates=[synth_pb2.GateVerdict(gate=v.gate, ok=v.ok, reason=v.reason) for v in b.verdicts],
        task_dir=str(b.task_dir),
    )


def _tri(v: bool | None) -> str:
    return "" if v is None else str(bool(v)).lower()


class _Servicer(synth_pb2_grpc.SynthServiceServicer):
    def __init__(self, service: SynthService, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    @property
    def _synth(self) -> Synthesizer:
        return self._service.synth(self._ctx)

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)

    async def IngestSkills(  # noqa: N802
        self, request: synth_pb2.IngestSkillsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.IngestSkillsReply:
        src = Path(request.source)
        if not request.source or not await asyncio.to_thread(src.exists):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"no skill folder or archive at {request.source!r}")
        _, events = await asyncio.to_thread(self._synth.ingest, src)
        await self._ctx.log.append_many(events)
        return synth_pb2.IngestSkillsReply(
            skills=[
                synth_pb2.SkillVerdict(
                    skill_id=e.skill_id, name=e.name, accepted=e.accepted, reason=e.reason, capabilities=e.capabilities
                )
                for e in events
            ]
        )

    async def BuildTasks(  # noqa: N802
        self, request: synth_pb2.BuildTasksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.BuildTasksReply:
        if request.level > 3 or request.challenges > 8 or request.tasks_per_skill > 1000:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "level <= 3, challenges <= 8, tasks_per_skill <= 1000"
            )
        patterns, knobs = list(request.patterns), dict(request.knobs)
        try:
            check_choice(patterns, knobs)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        with self._ctx.engine.connect() as conn:
            q = select(_S).where(_S.c.accepted.is_(True))
            if request.skill_ids:
                q = q.where(_S.c.skill_id.in_(list(request.skill_ids)))
            rows = list(conn.execute(q.order_by(_S.c.skill_id)))
        missing = set(request.skill_ids) - {r.skill_id for r in rows}
        if missing:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no accepted skill(s) {sorted(missing)}")
        if not rows:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no accepted skills: ingest some first")
        # Each skill as this store kept it at ingest (its files travel with its tasks), found by the catalogue's
        # digest; one the store did not ingest (another store's events, or ingested before skills were kept) is
        # refused rather than built without its skill.
        kept = await asyncio.to_thread(lambda: [(r, self._synth.kept(r.digest, r.name)) for r in rows])
        lost = sorted(r.skill_id for r, s in kept if s is None or s.skill_id != r.skill_id)
        if lost:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"skill(s) {lost}: this store kept no files for them (ingest them again through this service)",
            )
        skills = [s for _, s in kept if s is not None]
        n = request.tasks_per_skill or 1
        jobs = [(s, int(request.seed) + i) for s in skills for i in range(n)]
        builds = await asyncio.to_thread(
            self._synth.synthesize_many,
            jobs,
            n_challenges=len(patterns) or request.challenges or 2,
            level=request.level,
            patterns=patterns or None,
            knobs=knobs,
        )
        with self._ctx.engine.connect() as conn:
            known = {r.task_id for r in conn.execute(select(_T.c.task_id))}
        await self._ctx.log.append_many([e for b in builds if b.blueprint.task_id not in known for e in b.events])
        return synth_pb2.BuildTasksReply(tasks=[_verdicts(b) for b in builds])

    async def ListTasks(  # noqa: N802
        self, request: synth_pb2.ListTasksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.ListTasksReply:
        with self._ctx.engine.connect() as conn:
            rows = current_tasks(conn)
        return synth_pb2.ListTasksReply(
            tasks=[
                synth_pb2.TaskSummary(
                    task_id=r.task_id,
                    skill_id=r.skill_id,
                    version=r.task_version,
                    validated=_tri(r.validated),
                    too_easy_count=r.too_easy_count,
                    hardened_count=r.hardened_count,
                )
                for r in rows
            ]
        )

    async def _task_dir(
        self, task_id: str, version: int, context: grpc.aio.ServicerContext[Any, Any]
    ) -> tuple[int, Path]:
        if not task_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "task_id is required")
        with self._ctx.engine.connect() as conn:
            versions = {v.version: v for v in task_lineage(conn, task_id)}
        if not versions:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {task_id}")
        v = versions.get(version or max(versions))
        if v is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"task {task_id} has no version {version}")
        return v.version, Path(v.task_dir)

    async def ValidateTask(  # noqa: N802
        self, request: synth_pb2.ValidateTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.TaskVerdicts:
        version, d = await self._task_dir(request.task_id, request.version, context)
        verdicts, event = await asyncio.to_thread(self._synth.revalidate, request.task_id, version, d)
        await self._ctx.log.append_many([event])  # the task exists: only the new verdicts
        return synth_pb2.TaskVerdicts(
            task_id=request.task_id,
            version=version,
            ok=event.ok,
            gates=[synth_pb2.GateVerdict(gate=v.gate, ok=v.ok, reason=v.reason) for v in verdicts],
            task_dir=str(d),
        )

    async def ExportTask(  # noqa: N802
        self, request: synth_pb2.ExportTaskRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.ExportTaskReply:
        _, d = await self._task_dir(request.task_id, request.version, context)
        dest = Path(request.dest)
        if not request.dest or await asyncio.to_thread(dest.exists):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"dest {request.dest!r} is empty or exists")
        await asyncio.to_thread(shutil.copytree, d, dest)
        return synth_pb2.ExportTaskReply(path=str(dest))

    async def HardenTasks(  # noqa: N802
        self, request: synth_pb2.HardenTasksRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.HardenTasksReply:
        done = await self._service.harden_pending(self._ctx)
        return synth_pb2.HardenTasksReply(hardened=done)

    async def GetLineage(  # noqa: N802
        self, request: synth_pb2.GetLineageRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> synth_pb2.Lineage:
        with self._ctx.engine.connect() as conn:
            versions = task_lineage(conn, request.task_id)
        if not versions:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no task {request.task_id!r}")
        return synth_pb2.Lineage(
            task_id=request.task_id,
            versions=[
                synth_pb2.TaskVersion(
                    version=v.version,
                    parent_version=v.parent_version or 0,
                    patterns_json=v.patterns,
                    reason=v.reason,
                    validated=_tri(v.validated),
                    checks_json=v.checks,
                    task_dir=v.task_dir,
                )
                for v in versions
            ],
        )


class SynthService(Service):
    name = "synth"
    summary = "Skill2Env: agent skills into executable tasks with tunable difficulty, and the hardening loop"
    capabilities = (
        "status",
        "skill ingestion (SKILL.md, ClawHub metadata; folder, .zip, .tar.gz; the three filters)",
        "difficulty-pattern pool (30 patterns, five dimensions) with control knobs",
        "blueprints, Harbor task directories, rubric evaluators, validation gates",
        "hardening loop (windowed mean reward > 0.7) with lineage",
        "LLM synthesis mode (OPENGYRE_SYNTH_LLM_URL/_MODEL: any OpenAI-compatible endpoint), else procedural",
    )
    not_implemented = ()
    poll_s = 2.0

    def __init__(self) -> None:
        self._synth: Synthesizer | None = None
        self._hardening = HardeningProjection()
        self._worker: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def synth(self, ctx: ServiceContext) -> Synthesizer:
        if self._synth is None:
            self._synth = Synthesizer(ctx.settings.data_dir / "synth", llm=LlmConfig.from_env())
        return self._synth

    def projections(self) -> Sequence[Projection]:
        return (TasksProjection(), self._hardening)

    async def harden_pending(self, ctx: ServiceContext) -> list[synth_pb2.Hardening]:
        async with self._lock:  # one hardening at a time: the worker and HardenTasks share it
            synth = self.synth(ctx)
            done = []
            for task_id, version in synth.pending(ctx.engine):
                events = await asyncio.to_thread(synth.harden, ctx.engine, task_id, version, self._hardening)
                await ctx.log.append_many(events)
                for e in events:
                    if e.type_name() == "task-hardened":
                        done.append(
                            synth_pb2.Hardening(
                                task_id=task_id,
                                from_version=version,
                                to_version=getattr(e, "to_version", 0),
                                bypassed=getattr(e, "bypassed", ""),
                                reason=getattr(e, "reason", ""),
                            )
                        )
            return done

    async def start(self, ctx: ServiceContext) -> None:
        async def loop() -> None:
            while True:
                try:
                    await self.harden_pending(ctx)
                except Exception:  # a task that cannot be hardened now must not end the service
                    _log.exception("hardening step failed; retrying after %.0f s", self.poll_s)
                await asyncio.sleep(self.poll_s)

        self._worker = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        synth_pb2_grpc.add_SynthServiceServicer_to_server(_Servicer(self, ctx), server)
        # Named from its descriptor: that imports synth_pb2, which reflection needs to describe the service.
        return (synth_pb2.DESCRIPTOR.services_by_name["SynthService"].full_name,)
