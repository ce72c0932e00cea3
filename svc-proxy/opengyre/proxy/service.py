"""The proxy service process: gRPC ProxyService with health and reflection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, proxy_pb2_grpc

__all__ = ["ProxyService"]


class _Servicer(proxy_pb2_grpc.ProxyServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)


class ProxyService(Service):
    name = "proxy"
    summary = "QwenGyre token-in/token-out model gateway with trajectory trees"
    capabilities = ("status",)
    not_implemented = ()

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        proxy_pb2_grpc.add_ProxyServiceServicer_to_server(_Servicer(self, ctx), server)
        return ("opengyre.v1.ProxyService",)
