"""The gRPC ProxyService: engines, executions, trees, paths, ATIF, drain."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import grpc
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import subject_token
from opengyre.runtime import Service, ServiceContext
from opengyre.trajectory import PayloadUnavailable, TrajectoryTree
from opengyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc

from ._keys import ROLES
from .gateway import Gateway
from .recording._atif import export_execution
from .recording._recorder import ExecutionSealed, SealUnavailable
from .recording._trees import StoredCall, list_executions, load_calls, resolve_stored

__all__ = ["ProxyServicer"]

Ctx = grpc.aio.ServicerContext[Any, Any]


def _engine_msg(h: Any) -> proxy_pb2.Engine:
    return proxy_pb2.Engine(
        engine_id=h.engine_id,
        url=h.url,
        state=h.state,
        source=h.source,
        inflight=len(h.inflight),
        served=h.served,
        rerouted=h.rerouted,
    )


async def resolve_contexts(log: EventLog | None, calls: list[StoredCall]) -> dict[str, dict[str, Any]]:
    """Contexts that went out of band (``context_ref``), fetched from the object store."""
    out: dict[str, dict[str, Any]] = {}
    if log is None:
        return out
    for c in calls:
        if c.event.context is None and c.event.context_ref:
            out[c.event.call_id] = json.loads(await log.get_blob(c.event.context_ref))
    return out


class ProxyServicer(proxy_pb2_grpc.ProxyServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext, gateway: Gateway) -> None:
        self._service = service
        self._ctx = ctx
        self._gw = gateway

    @property
    def _db(self) -> Engine:
        return self._ctx.engine

    async def GetStatus(self, request: common_pb2.StatusRequest, context: Ctx) -> common_pb2.ServiceStatus:  # noqa: N802
        return await self._ctx.status(self._service)

    async def ListEngines(  # noqa: N802
        self, request: proxy_pb2.ListEnginesRequest, context: Ctx
    ) -> proxy_pb2.ListEnginesResponse:
        pool = self._gw.pool
        return proxy_pb2.ListEnginesResponse(
            engines=[_engine_msg(h) for h in pool.engines()], waiting=pool.waiting, rejected=pool.rejected
        )

    async def AddEngine(self, request: proxy_pb2.AddEngineRequest, context: Ctx) -> proxy_pb2.Engine:  # noqa: N802
        engine_id = request.engine_id or request.url
        existing = self._gw.pool.get(engine_id)
        if existing is not None and existing.state == "active" and existing.url != request.url.rstrip("/"):
            await context.abort(grpc.StatusCode.ALREADY_EXISTS, f"engine {engine_id} already routes to {existing.url}")
        try:
            return _engine_msg(await self._gw.pool.add(engine_id, request.url, source="grpc"))
        except ValueError as exc:  # the pool's clients speak http:// and vllm+http:// only
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise

    async def DrainEngine(  # noqa: N802
        self, request: proxy_pb2.DrainEngineRequest, context: Ctx
    ) -> proxy_pb2.DrainEngineResponse:
        if self._gw.pool.get(request.engine_id) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no engine {request.engine_id!r}")
        moved = await self._gw.pool.drain(request.engine_id, remove=not request.keep)
        return proxy_pb2.DrainEngineResponse(engine_id=request.engine_id, moved=moved)

    async def OpenExecution(  # noqa: N802
        self, request: proxy_pb2.OpenExecutionRequest, context: Ctx
    ) -> proxy_pb2.ExecutionAccess:
        role = request.role or "main"
        if role not in ROLES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"role must be one of {', '.join(ROLES)}")
        try:
            key = self._gw.issue_key(request.execution_id, role)  # type: ignore[arg-type]
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        try:
            # A sealed execution takes no more calls: a key for it would only be refused at its first call. Checked
            # after the key is made (the id is valid then); a refused one is never handed out.
            self._gw.recorder.check_open(request.execution_id)
        except ExecutionSealed as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        return proxy_pb2.ExecutionAccess(
            execution_id=request.execution_id,
            role=role,
            base_url=self._gw.base_url(request.execution_id),
            anthropic_base_url=f"{self._gw.url}/x/{request.execution_id}",
            api_key=key,
            context_length=self._gw.served_context().tokens,
        )

    async def ListExecutions(  # noqa: N802
        self, request: proxy_pb2.ListExecutionsRequest, context: Ctx
    ) -> proxy_pb2.ListExecutionsResponse:
        def q() -> list[Any]:
            with self._db.connect() as conn:
                return list_executions(conn, list(request.execution_ids))

        rows = await asyncio.to_thread(q)
        return proxy_pb2.ListExecutionsResponse(
            executions=[
                proxy_pb2.ExecutionSummary(
                    execution_id=r.execution_id,
                    calls=r.calls,
                    roots=r.roots,
                    drift=r.drift,
                    rerouted=r.rerouted,
                    stored_tokens=r.stored_tokens,
                    flat_tokens=r.flat_tokens,
                    last_seq=r.last_seq,
                )
                for r in rows
            ]
        )

    async def _stored(self, execution_id: str, context: Ctx) -> list[StoredCall]:
        def q() -> list[StoredCall]:
            with self._db.connect() as conn:
                return load_calls(conn, execution_id)

        calls = await asyncio.to_thread(q)
        if not calls:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no recorded calls for execution {execution_id!r}")
        return calls

    async def _calls(self, execution_id: str, context: Ctx) -> tuple[TrajectoryTree, list[StoredCall]]:
        """The execution's calls with their tokens (FAILED_PRECONDITION when retention compacted them)."""
        try:
            calls = await resolve_stored(self._ctx.log, await self._stored(execution_id, context))
        except PayloadUnavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"{exc.reason}: {exc}")
            raise
        return TrajectoryTree(execution_id, [c.event for c in calls]), calls

    async def GetTree(self, request: proxy_pb2.GetTreeRequest, context: Ctx) -> proxy_pb2.Tree:  # noqa: N802
        # The shape needs the rows only (lengths stay after compaction), not the payloads.
        calls = await self._stored(request.execution_id, context)
        children = {c.event.parent_call_id for c in calls}
        leaves = {c.event.call_id for c in calls if c.event.call_id not in children}
        nodes = []
        for c in calls:
            e = c.event
            nodes.append(
                proxy_pb2.TreeNode(
                    call_id=e.call_id,
                    parent_call_id=e.parent_call_id or "",
                    prefix_len=e.prefix_len,
                    prompt_delta_len=e.n_prompt_delta,
                    output_len=e.n_output,
                    role=e.role,
                    weight_version=e.weight_version,
                    engine_id=e.engine_id,
                    finish_reason=e.finish_reason,
                    branch=e.branch,
                    drift_kind=e.drift.kind if e.drift else "",
                    attempts=e.attempts,
                    leaf=e.call_id in leaves,
                )
            )
        return proxy_pb2.Tree(
            execution_id=request.execution_id,
            nodes=nodes,
            leaves=[c.event.call_id for c in calls if c.event.call_id in leaves],
        )

    async def GetPath(self, request: proxy_pb2.GetPathRequest, context: Ctx) -> proxy_pb2.Path:  # noqa: N802
        tree, _ = await self._calls(request.execution_id, context)
        if request.leaf_call_id not in tree:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no call {request.leaf_call_id!r}")
        p = tree.path_sequence(request.leaf_call_id)
        return proxy_pb2.Path(
            execution_id=request.execution_id,
            leaf_call_id=p.leaf,
            role=p.role,
            call_ids=list(p.call_ids),
            tokens=list(p.tokens),
            generated=list(p.generated),
            behaviour_logprobs=list(p.behaviour_logprobs),
        )

    async def ExportAtif(self, request: proxy_pb2.ExportAtifRequest, context: Ctx) -> proxy_pb2.AtifDocument:  # noqa: N802
        tree, calls = await self._calls(request.execution_id, context)
        contexts = await resolve_contexts(self._ctx.log, calls)
        doc = export_execution(tree, calls, contexts=contexts)
        return proxy_pb2.AtifDocument(execution_id=request.execution_id, json=json.dumps(doc))

    async def SealExecution(  # noqa: N802
        self, request: proxy_pb2.SealExecutionRequest, context: Ctx
    ) -> proxy_pb2.SealExecutionResponse:
        try:
            subject_token(request.execution_id)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"execution_id: {exc}")
        try:
            calls = await self._gw.seal_execution(request.execution_id)
        except SealUnavailable as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
            raise
        return proxy_pb2.SealExecutionResponse(
            execution_id=request.execution_id,
            recorded_calls=calls,
            failed_calls=self._gw.failed_calls(request.execution_id),
        )
