"""The trainer service process: gRPC TrainerService with health and reflection, and its projection."""

from __future__ import annotations

from collections.abc import Sequence

import grpc

from opengyre.projection import Projection
from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import trainer_pb2_grpc

from ._grpc import TrainerServicer
from ._projection import TrainerProjection

__all__ = ["TrainerService"]


class TrainerService(Service):
    name = "trainer"
    summary = "QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, weight publishing"
    capabilities = (
        "status",
        "executions",
        "steps",
        "weights",
        "sample-preview",
        "score",
    )
    not_implemented = ("pipeline-parallel",)

    def projections(self) -> Sequence[Projection]:
        return [TrainerProjection()]

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        trainer_pb2_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(self, ctx), server)
        return ("opengyre.v1.TrainerService",)
