"""The scheduler service process: gRPC SchedulerService with health and reflection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, scheduler_pb2_grpc

from ._projection import SchedulerProjection

__all__ = ["SchedulerService"]


class _Servicer(scheduler_pb2_grpc.SchedulerServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)


class SchedulerService(Service):
    name = "scheduler"
    summary = "QwenGyre elastic scheduler: cells move between rollout and training under the watermark rule"
    capabilities = ("status",)
    not_implemented = ()

    def projections(self) -> Sequence[Projection]:
        return (SchedulerProjection(),)

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        scheduler_pb2_grpc.add_SchedulerServiceServicer_to_server(_Servicer(self, ctx), server)
        return ("opengyre.v1.SchedulerService",)
