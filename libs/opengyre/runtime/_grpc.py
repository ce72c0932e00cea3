"""gRPC aio servers with the standard health and reflection services (so grpcurl works), every other RPC
behind the stack's bearer token (``_auth``)."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import grpc
from google.protobuf import descriptor_pool
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from ._auth import TokenAuth

__all__ = ["GrpcServer", "abort_invalid", "abort_status"]


log = logging.getLogger(__name__)

# gRPC turns SO_REUSEPORT on by default: a second server on a taken port then binds "successfully" and the kernel
# splits connections between the two. Off, a taken port is a bind error, which is what lets a process that asked
# for a default port fall back to a free one atomically (``fallback``) instead of trusting an earlier check.
_OPTIONS = [("grpc.so_reuseport", 0)]


class GrpcServer:
    """Build inside the running loop: grpc aio objects bound to another loop fail. The port is bound here;
    ``fallback``: if ``port`` is taken, bind a free one (``self.port`` says which). ``token``: the bearer token
    every call but health and reflection must carry (``UNAUTHENTICATED`` otherwise)."""

    def __init__(self, host: str, port: int, *, token: str, fallback: bool = False) -> None:
        self.server = grpc.aio.server(options=_OPTIONS, interceptors=[TokenAuth(token)])
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        bound = _bind(self.server, host, port)
        if bound == 0 and fallback and port != 0:
            log.warning("port %d is taken: serving gRPC on a free port instead", port)
            bound = _bind(self.server, host, 0)
        if bound == 0:
            raise OSError(f"cannot bind gRPC to {host}:{port} (in use?)")
        self.port = bound
        self._names: list[str] = [health.SERVICE_NAME]
        self.serving = False

    def register(self, full_names: Iterable[str]) -> None:
        """Services to report in health and reflection; each must be described in the default descriptor
        pool (its ``_pb2`` module imported), or reflection would list it and fail to describe it."""
        names = list(full_names)
        pool = descriptor_pool.Default()
        for name in names:
            try:
                pool.FindServiceByName(name)
            except KeyError:
                raise RuntimeError(
                    f"gRPC service {name} has no descriptor loaded, so reflection could not describe it: "
                    "import its _pb2 module (name it from the descriptor: X_pb2.DESCRIPTOR.services_by_name)"
                ) from None
        self._names.extend(names)

    async def start(self) -> None:
        reflection.enable_server_reflection([*self._names, reflection.SERVICE_NAME], self.server)
        await self.server.start()
        await self.set_serving(True)

    async def set_serving(self, serving: bool) -> None:
        """Health of the server and of every service on it: NOT_SERVING while the service cannot do its work
        (its event log is away), so a load balancer or `opengyre status` sees it."""
        self.serving = serving
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in [*self._names, ""]:
            await self.health.set(name, status)

    async def stop(self, grace: float = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace)


def _bind(server: grpc.aio.Server, host: str, port: int) -> int:
    """The bound port, 0 when the address is taken (grpc raises or returns 0 depending on the version)."""
    try:
        return int(server.add_insecure_port(f"{host}:{port}"))
    except RuntimeError:
        return 0


async def abort_status(context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str) -> None:
    await context.abort(code, message)


async def abort_invalid(context: grpc.aio.ServicerContext[Any, Any], message: str) -> None:
    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, message)
