"""The bench service process: gRPC BenchService with health and reflection."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import bench_pb2, bench_pb2_grpc, common_pb2

from ._hardware import hardware
from ._profiles import PAPER_PROFILES
from ._roofline import ConfigError, ModelShape, roofline_report

__all__ = ["BenchService"]


class _Servicer(bench_pb2_grpc.BenchServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)

    async def ListProfiles(  # noqa: N802
        self, request: bench_pb2.ListProfilesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bench_pb2.ListProfilesResponse:
        return bench_pb2.ListProfilesResponse(profiles={n: json.dumps(p.to_dict()) for n, p in PAPER_PROFILES.items()})

    async def Roofline(  # noqa: N802
        self, request: bench_pb2.RooflineRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bench_pb2.RooflineResponse:
        try:
            if request.isl == 0 or request.osl == 0:
                raise ValueError("isl and osl must be positive")
            try:
                cfg = json.loads(request.config_json)
            except ValueError as e:
                raise ConfigError(f"config_json is not valid JSON: {e}") from None
            shape = ModelShape.from_config(cfg)
            hw = hardware(request.hardware)
            doc = roofline_report(
                shape,
                hw,
                isl=request.isl,
                osl=request.osl,
                batch=request.batch or 1,
                tp=request.tp or 1,
                memory_utilisation=request.memory_utilisation or 1.0,
            )
        except (ConfigError, KeyError, ValueError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e).strip("'\""))
            raise AssertionError("unreachable") from e
        return bench_pb2.RooflineResponse(
            report_json=json.dumps(doc),
            ridge=hw.ridge,
            prefill_projection_oi=doc["projection_oi"]["prefill"],
            decode_projection_oi=doc["projection_oi"]["decode"],
            max_concurrency=doc["capacity"]["max_concurrency"],
        )


class BenchService(Service):
    name = "bench"
    summary = "AgentPerfBench: agentic workload profiles, saturation sweeps, roofline"
    capabilities = ("status", "profiles", "roofline")
    # Load runs and sweeps are driven from the CLI (`opengyre bench run|sweep`), which publishes
    # bench-run-completed; the service does not start load runs itself yet.
    not_implemented = ("load runs and sweeps over gRPC (use `opengyre bench run|sweep`)",)

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        bench_pb2_grpc.add_BenchServiceServicer_to_server(_Servicer(self, ctx), server)
        return (bench_pb2.DESCRIPTOR.services_by_name["BenchService"].full_name,)
