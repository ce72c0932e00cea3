"""The trainer service process: gRPC TrainerService with health and reflection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, trainer_pb2_grpc

__all__ = ["TrainerService"]


class _Servicer(trainer_pb2_grpc.TrainerServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)


class TrainerService(Service):
    name = "trainer"
    summary = "QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, weight publishing"
    capabilities = ("status",)
    not_implemented = ()

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(_Servicer(self, ctx), server)
        return ("opengyre.v1.TrainerService",)
