"""The synth service process: gRPC SynthService with health and reflection."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import common_pb2, synth_pb2, synth_pb2_grpc

from ._hardening import HardeningProjection
from ._tasks import TasksProjection

__all__ = ["SynthService"]


class _Servicer(synth_pb2_grpc.SynthServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)


class SynthService(Service):
    name = "synth"
    summary = "Skill2Env: agent skills into executable tasks with tunable difficulty, and the hardening loop"
    capabilities = ("status", "task catalogue projection (skills, task versions, too-easy, hardened)")
    # A later issue builds these; until then the service says so in GetStatus and `opengyre status`.
    not_implemented = (
        "skill ingestion (SKILL.md, ClawHub metadata)",
        "difficulty-pattern pool with control knobs",
        "task blueprints and Harbor task directories",
        "rubric evaluators",
        "hardening loop (reward > 0.7)",
    )

    def projections(self) -> Sequence[Projection]:
        return (TasksProjection(), HardeningProjection())

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        synth_pb2_grpc.add_SynthServiceServicer_to_server(_Servicer(self, ctx), server)
        # Named from its descriptor: that imports synth_pb2, which reflection needs to describe the service
        # (synth_pb2_grpc alone does not import it, since the service's messages all live in common.proto).
        return (synth_pb2.DESCRIPTOR.services_by_name["SynthService"].full_name,)
