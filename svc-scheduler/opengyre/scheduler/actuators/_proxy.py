"""Drain through the proxy's gRPC ``DrainEngine``: it stops routing to the cell's engine, aborts the engine's
in-flight requests and waits until each has been re-issued on another engine. The proxy's cell watcher starts
the same drain on the ``draining`` event; this call is the confirmation the protocol waits for before the
engine is released. An engine the proxy no longer lists has nothing left in flight."""

from __future__ import annotations

import grpc

from opengyre.runtime import grpc_channel
from opengyre.v1 import proxy_pb2, proxy_pb2_grpc

from ._base import ActuatorError

__all__ = ["ProxyDrainer"]


class ProxyDrainer:
    def __init__(self, addr: str, *, token: str | None, timeout_s: float = 300.0) -> None:
        """``token``: the stack's gRPC bearer token (None: the proxy refuses the call, UNAUTHENTICATED)."""
        self.addr = addr
        self.token = token
        self.timeout_s = timeout_s

    async def drain(self, cell_id: str, engine_url: str | None) -> int:
        async with grpc_channel(self.addr, self.token) as channel:
            stub = proxy_pb2_grpc.ProxyServiceStub(channel)
            try:
                r = await stub.DrainEngine(proxy_pb2.DrainEngineRequest(engine_id=cell_id), timeout=self.timeout_s)
            except grpc.aio.AioRpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    return 0  # already drained and removed (the proxy's cell watcher got there first)
                # Unconfirmed: releasing the engine now could kill live requests, so the protocol stops here.
                raise ActuatorError(f"proxy at {self.addr} could not drain {cell_id}: {exc.code().name}") from exc
            return int(r.moved)
