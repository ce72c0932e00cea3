"""The gRPC surface of the trainer: read its projection, preview sampling, grade executions."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from opengyre.events import ExecutionFinished
from opengyre.grading import evaluator_from_env
from opengyre.runtime import Service, ServiceContext
from opengyre.trajectory import TrajectoryError
from opengyre.v1 import common_pb2, trainer_pb2, trainer_pb2_grpc

from ._admission import AdmissionPolicy
from ._cost import sample_cost
from ._failures import REPORTABLE_CLASSES
from ._sampling import PathSampler
from ._scoring import SANDBOX_NAME, score_execution
from ._store import TrainerStore

if TYPE_CHECKING:
    from ._loop import OnlineTrainer

__all__ = ["TrainerServicer"]

Ctx = grpc.aio.ServicerContext[Any, Any]


class TrainerServicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(
        self, service: Service, ctx: ServiceContext, online: Callable[[], OnlineTrainer | None] = lambda: None
    ) -> None:
        self._service = service
        self._ctx = ctx
        self._online = online  # the process's online trainer, when it trains
        self._store = TrainerStore(ctx.engine)
        # The sandboxed grader, and the LLM judge after it when the environment names one (a half-set judge
        # fails the start: OPENGYRE_JUDGE_URL and OPENGYRE_JUDGE_MODEL go together).
        self._evaluator = evaluator_from_env()

    async def GetStatus(self, request: common_pb2.StatusRequest, context: Ctx) -> common_pb2.ServiceStatus:  # noqa: N802
        return await self._ctx.status(self._service)

    async def GetExecution(  # noqa: N802
        self, request: trainer_pb2.GetExecutionRequest, context: Ctx
    ) -> trainer_pb2.TrainerExecution:
        if not request.execution_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "execution_id is required")
        row = await asyncio.to_thread(self._store.execution, request.execution_id)
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no execution {request.execution_id}")
        assert row is not None
        corrupt = await asyncio.to_thread(self._store.corrupt, [request.execution_id])
        score = row["score"]
        return trainer_pb2.TrainerExecution(
            execution_id=str(row["execution_id"]),
            task_id=str(row["task_id"]),
            group_id=str(row["group_id"]),
            status=str(row["status"]),
            has_score=score is not None,
            score=float(score) if isinstance(score, int | float) else 0.0,
            failure_class=str(row["failure_class"] or ""),
            verdict=str(row["verdict"]),
            reason=str(row["reason"]),
            n_calls=int(row["n_calls"]),
            n_generated=int(row["n_generated"]),
            consumed=row["consumed_step"] is not None,
            consumed_step=int(row["consumed_step"] or 0),
            consumed_as=str(row["consumed_as"] or ""),
            corrupt_reason=corrupt.get(request.execution_id, ""),
            weight_version=str(row["weight_version"]),
            has_recorded_calls=row["recorded_calls"] is not None,
            recorded_calls=int(row["recorded_calls"] or 0),
        )

    async def ListReadyGroups(  # noqa: N802
        self, request: trainer_pb2.ListReadyGroupsRequest, context: Ctx
    ) -> trainer_pb2.ListReadyGroupsReply:
        size = request.default_group_size or 16
        groups = await asyncio.to_thread(self._store.ready_groups, size, request.limit or None)
        reply = trainer_pb2.ListReadyGroupsReply()
        for g in groups:
            adm = AdmissionPolicy(group_size=size).admit(g.group_id, g.outcomes, g.size or None)
            reply.groups.append(
                trainer_pb2.ReadyGroup(
                    group_id=g.group_id,
                    task_id=g.task_id,
                    breaker_tripped=adm.breaker_tripped,
                    mean=adm.mean,
                    std=adm.std,
                    survivors=adm.survivors,
                    members=[
                        trainer_pb2.MemberAdmission(
                            execution_id=a.execution_id,
                            decision=a.decision,
                            reason=a.reason,
                            advantage=a.advantage,
                            has_score=a.score is not None,
                            score=a.score or 0.0,
                        )
                        for a in adm.admissions
                    ],
                )
            )
        return reply

    async def PreviewSamples(  # noqa: N802
        self, request: trainer_pb2.PreviewSamplesRequest, context: Ctx
    ) -> trainer_pb2.PreviewSamplesReply:
        if request.max_paths < -1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "max_paths must be -1 (unbounded), 0 (5) or > 0")
        if await asyncio.to_thread(self._store.execution, request.execution_id) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no execution {request.execution_id}")
        corrupt = await asyncio.to_thread(self._store.corrupt, [request.execution_id])
        if corrupt:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION, f"trajectory rejected: {corrupt[request.execution_id]}"
            )
        payloads = await self._store.fetch_payloads(self._ctx.log, [request.execution_id])
        try:
            tree = await asyncio.to_thread(self._store.tree, request.execution_id, payloads)
        except TrajectoryError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        j = None if request.max_paths == -1 else (request.max_paths or 5)
        drawn = PathSampler(j).sample(tree, random.Random(request.seed))
        cost = sample_cost(tree, drawn)
        return trainer_pb2.PreviewSamplesReply(
            paths=[
                trainer_pb2.PreviewPath(
                    leaf=d.path.leaf,
                    role=d.path.role,
                    n_tokens=len(d.path.tokens),
                    n_targets=d.n_targets,
                    draw_weight=d.draw_weight,
                )
                for d in drawn
            ],
            tree_nodes=len(tree),
            tree_leaves=cost.leaves,
            generated_tokens=cost.generated_tokens,
            target_tokens=cost.target_tokens,
            forward_tokens=cost.forward_tokens,
            all_paths_forward_tokens=cost.all_paths_forward_tokens,
        )

    async def ListSteps(self, request: trainer_pb2.ListStepsRequest, context: Ctx) -> trainer_pb2.ListStepsReply:  # noqa: N802
        rows = await asyncio.to_thread(self._store.steps, request.run_id or "default")
        return trainer_pb2.ListStepsReply(
            steps=[
                trainer_pb2.TrainingStep(
                    step=int(r["step"]),
                    weight_version=str(r["weight_version"]),
                    loss=float(r["loss"]),
                    n_samples=int(r["n_samples"]),
                    n_tokens=int(r["n_tokens"]),
                    n_trained=int(r["n_trained"]),
                    n_dropped=int(r["n_dropped"]),
                    staleness_mean=float(r["staleness_mean"]),
                    staleness_max=int(r["staleness_max"]),
                    grad_norm=float(r["grad_norm"] or 0.0),
                    has_reward_mean=r["reward_mean"] is not None,
                    reward_mean=float(r["reward_mean"] or 0.0),
                )
                for r in rows
            ]
        )

    async def ListWeights(  # noqa: N802
        self, request: trainer_pb2.ListWeightsRequest, context: Ctx
    ) -> trainer_pb2.ListWeightsReply:
        rows = await asyncio.to_thread(self._store.weights, request.run_id or "default")
        return trainer_pb2.ListWeightsReply(
            versions=[
                trainer_pb2.WeightVersion(weight_version=r.weight_version, step=r.step, uri=r.uri, digest=r.digest)
                for r in rows
            ]
        )

    async def GetEngineVersions(  # noqa: N802
        self, request: trainer_pb2.GetEngineVersionsRequest, context: Ctx
    ) -> trainer_pb2.GetEngineVersionsReply:
        trainer = self._online()
        if trainer is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this trainer does not train (no trainer.toml)")
        assert trainer is not None
        run = trainer.config.run_id
        latest = await asyncio.to_thread(self._store.latest_weights, run)
        return trainer_pb2.GetEngineVersionsReply(
            run_id=run,
            latest_weight_version=latest.weight_version if latest is not None else "",
            engines=[
                trainer_pb2.EngineVersion(
                    url=st.url, serving=st.serving or "", failed_version=st.failed_version or "", message=st.message
                )
                for st in list(trainer.engines.values())
            ],
        )

    async def ScoreExecution(  # noqa: N802
        self, request: trainer_pb2.ScoreExecutionRequest, context: Ctx
    ) -> trainer_pb2.ScoreExecutionReply:
        task_dir, workspace = Path(request.task_dir), Path(request.workspace)
        if not request.execution_id or not request.task_dir or not request.workspace:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "execution_id, task_dir and workspace are required")
        has_test, has_ws = await asyncio.to_thread(
            lambda: ((task_dir / "tests" / "test.sh").is_file(), workspace.is_dir())
        )
        if not has_test:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{task_dir} has no tests/test.sh")
        if not has_ws:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"workspace {workspace} is not a directory")
        row = await asyncio.to_thread(self._store.execution, request.execution_id)
        if row is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no execution {request.execution_id}")
        assert row is not None
        if row["status"] != "running":
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"{request.execution_id} already finished")
        failure = request.failure_class or None
        if failure is not None and failure not in REPORTABLE_CLASSES:
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"failure_class must be one of {', '.join(sorted(REPORTABLE_CLASSES))}, got {failure!r}",
            )
        if request.sandbox and not SANDBOX_NAME.fullmatch(request.sandbox):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"sandbox must name an isolation (namespace, none, nested, docker, ...), got {request.sandbox!r}",
            )
        fin: ExecutionFinished = await asyncio.to_thread(
            score_execution,
            request.execution_id,
            self._evaluator,
            task_dir,
            workspace,
            timed_out=request.timed_out,
            exit_code=request.exit_code if request.has_exit_code else None,
            output=request.output,
            failure=failure,  # type: ignore[arg-type]  # checked against REPORTABLE_CLASSES above
            recorded_calls=request.recorded_calls if request.has_recorded_calls else None,
            sandbox=request.sandbox,
        )
        appended = await self._ctx.log.append(fin)
        return trainer_pb2.ScoreExecutionReply(
            status=fin.status,
            has_score=fin.score is not None,
            score=fin.score or 0.0,
            failure_class=fin.failure_class or "",
            detail=fin.detail,
            seq=appended.seq,
        )
