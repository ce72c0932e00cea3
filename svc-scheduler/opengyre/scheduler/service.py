"""The scheduler service process: gRPC SchedulerService over the live controller, with health and reflection.

Configuration (environment):
  OPENGYRE_SCHEDULER_POLICY          elastic (default) | elastic-carry | colocate | colocate-resident | async | ...
  OPENGYRE_SCHEDULER_AUTO            0: the policy only advises (default); 1: its role changes are carried out
  OPENGYRE_SCHEDULER_ACTUATOR        external (default) | local | sglang-megatron
  OPENGYRE_SCHEDULER_TRAINER_CMD     sglang-megatron: the trainer launcher, an argv template
  OPENGYRE_SCHEDULER_PROXY_ADDR      the proxy's gRPC host:port, which confirms drains (default: the stack's proxy on
                                     this host; "none": no proxy). In containers, the proxy's service address.
  OPENGYRE_SCHEDULER_MAX_LAG, _GROUPS_PER_STEP, _GROUP_SIZE, _STEPS   the RL loop (1, 32, 16, unbounded)
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import time
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from typing import Any, cast

import grpc

from opengyre.config import GRPC_TOKEN_ENV, Settings
from opengyre.events import CellEngineChanged, CellRegistered, CellRole
from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, scheduler_pb2, scheduler_pb2_grpc

from ._commands import CommandRefused
from ._controller import RoleChangeOutcome, SchedulerController
from ._dispatch import GroupAsk
from ._grpc import STATUS, cell_pb, state_pb
from ._policy import LoopConfig, Policy, RoleRequest, Target, View
from ._projection import SchedulerProjection
from ._state import SchedulerState
from .actuators import (
    Actuator,
    ActuatorError,
    ExternalActuator,
    LocalActuator,
    ProxyDrainer,
    SglangMegatronActuator,
)
from .policies import POLICIES, make_policy

__all__ = ["SchedulerService", "local_address", "proxy_address"]

Ctx = grpc.aio.ServicerContext[Any, Any]


class _Servicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, service: SchedulerService, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    @property
    def _c(self) -> SchedulerController:
        assert self._service.controller is not None
        return self._service.controller

    async def _refuse(self, context: Ctx, exc: CommandRefused) -> None:
        await context.abort(STATUS[exc.code], exc.message)

    async def GetStatus(self, request: common_pb2.StatusRequest, context: Ctx) -> common_pb2.ServiceStatus:  # noqa: N802
        return await self._ctx.status(self._service)

    async def RegisterCell(  # noqa: N802
        self, request: scheduler_pb2.RegisterCellRequest, context: Ctx
    ) -> scheduler_pb2.CellInfo:
        try:  # the role, like the rest, is judged by check_registration
            event = CellRegistered(
                cell_id=request.cell_id, node=request.node or "local", gpus=request.gpus, capacity=request.capacity,
                role=cast(CellRole, request.role or "rollout"), engine_url=request.engine_url or None,
                resident=request.resident,
            )  # fmt: skip
            event.aggregate_id()
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            return cell_pb(await self._c.register(event))
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise

    async def SetCellEngine(  # noqa: N802
        self, request: scheduler_pb2.SetCellEngineRequest, context: Ctx
    ) -> scheduler_pb2.CellInfo:
        event = CellEngineChanged(cell_id=request.cell_id, engine_url=request.engine_url, reason=request.reason)
        try:
            return cell_pb(await self._c.change_engine(event))
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise

    async def GetState(  # noqa: N802
        self, request: scheduler_pb2.GetStateRequest, context: Ctx
    ) -> scheduler_pb2.SchedulerStateView:
        return await self._view()

    async def _view(self) -> scheduler_pb2.SchedulerStateView:
        return self._view_of(await self._c.state())

    def _view_of(self, st: SchedulerState) -> scheduler_pb2.SchedulerStateView:
        c = self._c
        # The advice of this very state (not the last tick's), so a reader never sees advice already acted on.
        advice = c.policy.decide(View(st, time.time(), c.loop))
        return state_pb(st, advice, policy=c.policy.name, auto=c.auto)

    async def WatchState(  # noqa: N802
        self, request: scheduler_pb2.WatchStateRequest, context: Ctx
    ) -> AsyncIterator[scheduler_pb2.SchedulerStateView]:
        # A view per committed position, sent when it differs from the last one sent: the view (and its
        # advice) is a function of the state alone, so a still log costs a watcher nothing.
        last: bytes | None = None
        seen: SchedulerState | None = None
        sent = 0
        async for st in self._c.states():
            if st is seen:
                continue
            seen = st
            view = self._view_of(st)
            blob = view.SerializeToString(deterministic=True)
            if blob == last:
                continue
            last = blob
            sent += 1
            yield view
            if sent == request.max_updates:
                return

    async def _carry_out(
        self, context: Ctx, cell_id: str, change: Awaitable[RoleChangeOutcome]
    ) -> scheduler_pb2.RoleChangeResult:
        try:
            out = await change
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise
        except ActuatorError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cell {cell_id}: {exc}")
            raise
        return scheduler_pb2.RoleChangeResult(cell=cell_pb(out.cell), steps=out.steps)

    async def ForceRole(  # noqa: N802
        self, request: scheduler_pb2.ForceRoleRequest, context: Ctx
    ) -> scheduler_pb2.RoleChangeResult:
        target = request.target
        if target not in ("training", "rollout"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"target must be training or rollout, not {target!r}")
        req = RoleRequest(request.cell_id, cast(Target, target), request.reason or "operator")
        return await self._carry_out(context, request.cell_id, self._c.change_role(req))

    async def DrainCell(  # noqa: N802
        self, request: scheduler_pb2.DrainCellRequest, context: Ctx
    ) -> scheduler_pb2.RoleChangeResult:
        drain = self._c.drain_cell(request.cell_id, request.reason or "operator drain")
        return await self._carry_out(context, request.cell_id, drain)

    async def ClaimMicroStep(  # noqa: N802
        self, request: scheduler_pb2.ClaimMicroStepRequest, context: Ctx
    ) -> scheduler_pb2.ClaimMicroStepReply:
        try:
            claim = await self._c.claim(request.cell_id)
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise
        if claim is None:
            return scheduler_pb2.ClaimMicroStepReply(claimed=False)
        m = claim.micro
        return scheduler_pb2.ClaimMicroStepReply(
            claimed=True, step=m.step, index=m.index, group_ids=m.group_ids, execution_ids=claim.execution_ids
        )

    async def DispatchGroups(  # noqa: N802
        self, request: scheduler_pb2.DispatchGroupsRequest, context: Ctx
    ) -> scheduler_pb2.DispatchGroupsReply:
        size = self._c.loop.group_size
        asks = [GroupAsk(g.group_id, g.task_id, g.task_version or 1, g.group_size or size) for g in request.groups]
        try:
            out = await self._c.dispatch(asks, request.timeout_s)
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise
        urls = {c.cell_id: c.engine_url or "" for c in (await self._c.state()).cells_in_order()}
        return scheduler_pb2.DispatchGroupsReply(
            step=out.step,
            weight_version=out.weight_version,
            executions=[
                scheduler_pb2.DispatchedExecution(
                    execution_id=e, group_id=g, task_id=t, task_version=v, cell_id=c, engine_url=urls.get(c, "")
                )
                for e, g, t, v, c in out.members
            ],
            seq=out.seq,
        )

    async def CompleteMicroStep(  # noqa: N802
        self, request: scheduler_pb2.CompleteMicroStepRequest, context: Ctx
    ) -> scheduler_pb2.CompleteMicroStepReply:
        try:
            done, ids = await self._c.complete(request.cell_id, request.step, request.index)
        except CommandRefused as exc:
            await self._refuse(context, exc)
            raise
        return scheduler_pb2.CompleteMicroStepReply(step_complete=done, execution_ids=ids)


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def local_address(host: str, port: int) -> str:
    """Where a process on this machine reaches a server bound to ``host``: a wildcard bind (0.0.0.0, ::) is
    an address to listen on, not one to dial."""
    dial = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    return f"{dial}:{port}"


def proxy_address(settings: Settings, env: Mapping[str, str]) -> str:
    """The proxy's gRPC address: ``OPENGYRE_SCHEDULER_PROXY_ADDR``, else the stack's proxy on this machine."""
    return env.get("OPENGYRE_SCHEDULER_PROXY_ADDR") or local_address(settings.host, settings.ports["proxy"])


def _actuator_from_env(ctx: ServiceContext) -> Actuator:
    env = os.environ
    kind = env.get("OPENGYRE_SCHEDULER_ACTUATOR", "external")
    addr = local_address(ctx.settings.host, ctx.settings.ports["scheduler"])
    workdir = ctx.settings.data_dir / "cells"
    proxy = proxy_address(ctx.settings, env)
    token = ctx.settings.grpc_token()
    drainer = None if proxy == "none" else ProxyDrainer(proxy, token=token)
    # A cell's trainer worker calls this scheduler: it is handed the token (not the data dir it may not share).
    child_env = {GRPC_TOKEN_ENV: token} if token else {}
    if kind == "local":
        return LocalActuator(workdir, scheduler_addr=addr, drainer=drainer, env=child_env)
    if kind == "sglang-megatron":
        cmd = env.get("OPENGYRE_SCHEDULER_TRAINER_CMD")
        if not cmd:
            raise RuntimeError("OPENGYRE_SCHEDULER_TRAINER_CMD (the trainer launcher, an argv template) is required")
        return SglangMegatronActuator(
            workdir, trainer_argv=shlex.split(cmd), scheduler_addr=addr, drainer=drainer, env=child_env
        )
    if kind != "external":
        raise RuntimeError(f"OPENGYRE_SCHEDULER_ACTUATOR={kind!r}: expected external, local or sglang-megatron")
    return ExternalActuator(drainer)


class SchedulerService(Service):
    name = "scheduler"
    summary = "QwenGyre elastic scheduler: cells move between rollout and training under the watermark rule"
    capabilities = (
        "status",
        "register-cell",
        "state",
        "watch-state",
        "drain-cell",
        "force-role",
        "micro-step-claims",
        "dispatch-groups",
        "policies:" + ",".join(sorted(POLICIES)),
        "actuators:external,local,sglang-megatron",
    )
    not_implemented = ()

    def __init__(
        self,
        *,
        policy: Policy | None = None,
        loop: LoopConfig | None = None,
        actuator: Actuator | None = None,
        auto: bool | None = None,
        poll_s: float = 30.0,
    ) -> None:
        """``poll_s``: the controller's fallback period; its loop ticks on each fold and each role change's end
        (what can change its advice), so this only retries a tick that failed."""
        self._policy = policy
        self._loop = loop
        self._actuator = actuator
        self._auto = auto
        self._poll_s = poll_s
        self.controller: SchedulerController | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def projections(self) -> Sequence[Projection]:
        return (SchedulerProjection(),)

    async def start(self, ctx: ServiceContext) -> None:
        env = os.environ
        policy = self._policy or make_policy(env.get("OPENGYRE_SCHEDULER_POLICY", "elastic"))
        loop = self._loop or LoopConfig(
            max_lag=_env_int("OPENGYRE_SCHEDULER_MAX_LAG", 1),
            groups_per_step=_env_int("OPENGYRE_SCHEDULER_GROUPS_PER_STEP", 32),
            group_size=_env_int("OPENGYRE_SCHEDULER_GROUP_SIZE", 16),
            steps=_env_int("OPENGYRE_SCHEDULER_STEPS", 1_000_000),
        )
        loop.validate()
        policy.validate(loop)
        actuator = self._actuator or _actuator_from_env(ctx)
        auto = self._auto if self._auto is not None else env.get("OPENGYRE_SCHEDULER_AUTO", "0") == "1"
        runner = ctx.runners.get(SchedulerProjection.name)
        self.controller = SchedulerController(
            engine=ctx.engine, log=ctx.log, policy=policy, loop=loop, actuator=actuator, auto=auto,
            poll_s=self._poll_s, caught_up=runner.wait_caught_up if runner is not None else None,
            applied=runner.applied if runner is not None else None,
            positions=runner.positions if runner is not None else None,
            committed=(lambda: runner.position) if runner is not None else None,
        )  # fmt: skip
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self.controller.run(self._stop), name="scheduler-controller")

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.controller is not None:
            await self.controller.close()

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(_Servicer(self, ctx), server)
        return ("opengyre.v1.SchedulerService",)
