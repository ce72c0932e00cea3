"""The bench service process: gRPC BenchService with health and reflection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import bench_pb2, bench_pb2_grpc, common_pb2

__all__ = ["BenchService"]


class _Servicer(bench_pb2_grpc.BenchServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)


class BenchService(Service):
    name = "bench"
    summary = "AgentPerfBench: agentic workload profiles, saturation sweeps, roofline"
    capabilities = ("status",)
    # A later issue builds these; until then the service says so in GetStatus and `opengyre status`.
    not_implemented = (
        "agentic workload profiles",
        "closed-loop concurrency sweeps to saturation",
        "analytic roofline (operational intensity, capacity footprint)",
    )

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        bench_pb2_grpc.add_BenchServiceServicer_to_server(_Servicer(self, ctx), server)
        # Named from its descriptor: that imports bench_pb2, which reflection needs to describe the service
        # (bench_pb2_grpc alone does not import it, since the service's messages all live in common.proto).
        return (bench_pb2.DESCRIPTOR.services_by_name["BenchService"].full_name,)
