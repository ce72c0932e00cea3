"""The stack's gRPC bearer token: one random secret per data dir, required on every service RPC.

Without it any local process could call a service's admin RPCs (the proxy's ``AddEngine``, say, pointing at
its own engine). The token lives 0600 in ``<data dir>/auth/grpc.token``, written once and reused by every later
``opengyre up``; clients send it as ``authorization: Bearer <token>`` metadata. The gRPC health and reflection
services stay open: health is what healthchecks (docker-compose, ``opengyre status``) probe, and reflection
describes the API, which is public anyway; neither acts on the stack.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from ..config import GRPC_TOKEN_ENV, read_grpc_token

__all__ = [
    "GRPC_TOKEN_ENV",
    "OPEN_METHOD_PREFIXES",
    "TokenAuth",
    "auth_metadata",
    "grpc_channel",
    "token_from_env",
]

# Methods any caller may use: health (healthchecks) and reflection (describes the API; changes nothing).
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.v1alpha.ServerReflection/")


def token_from_env() -> str | None:
    """``OPENGYRE_GRPC_TOKEN``, else the token of ``$OPENGYRE_DATA_DIR`` (what a stack's own children have)."""
    token = os.environ.get(GRPC_TOKEN_ENV, "").strip()
    if token:
        return token
    data_dir = os.environ.get("OPENGYRE_DATA_DIR")
    return read_grpc_token(Path(data_dir)) if data_dir else None


def auth_metadata(token: str) -> tuple[tuple[str, str]]:
    return (("authorization", f"Bearer {token}"),)


class TokenAuth(grpc.aio.ServerInterceptor):
    """Refuses with ``UNAUTHENTICATED`` every call without ``authorization: Bearer <token>`` (health and
    reflection excepted, see ``OPEN_METHOD_PREFIXES``)."""

    def __init__(self, token: str) -> None:
        if not token:
            raise ValueError("an empty gRPC token would let any caller in")
        self._want = f"Bearer {token}".encode()

    def allows(self, metadata: Any) -> bool:
        got = ""
        for key, value in metadata or ():
            if key == "authorization":
                got = value if isinstance(value, str) else value.decode(errors="replace")
        return hmac.compare_digest(got.encode(), self._want)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        method = handler_call_details.method or ""
        handler = await continuation(handler_call_details)
        if handler is None or method.startswith(OPEN_METHOD_PREFIXES):
            return handler
        if self.allows(handler_call_details.invocation_metadata):
            return handler
        return _refusing(handler, method)


def _refusing(handler: grpc.RpcMethodHandler[Any, Any], method: str) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as ``handler`` that aborts with UNAUTHENTICATED."""
    message = f"{method}: missing or wrong bearer token (the stack's is in <data dir>/auth/grpc.token)"

    async def deny(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(deny, **kw)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(deny, **kw)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(deny, **kw)
    return grpc.stream_stream_rpc_method_handler(deny, **kw)


class _SendToken:
    def __init__(self, token: str) -> None:
        self._md = auth_metadata(token)

    def _details(self, d: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        metadata = grpc.aio.Metadata(*(d.metadata or ()), *self._md)
        return grpc.aio.ClientCallDetails(d.method, d.timeout, metadata, d.credentials, d.wait_for_ready)


# grpc.aio files an interceptor under the first of these kinds it is: one class each.
class _UnaryUnary(_SendToken, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _UnaryStream(_SendToken, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return await continuation(self._details(client_call_details), request)


class _StreamUnary(_SendToken, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


class _StreamStream(_SendToken, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return await continuation(self._details(client_call_details), request_iterator)


def grpc_channel(target: str, token: str | None, **kwargs: Any) -> grpc.aio.Channel:
    """An insecure (loopback) aio channel that sends ``token`` on every call; every client of a service's RPCs
    in the project opens its channel here. ``token`` None: the caller has none (health checks only)."""
    kinds = (_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream)
    interceptors: list[grpc.aio.ClientInterceptor] | None = [k(token) for k in kinds] if token else None
    return grpc.aio.insecure_channel(target, interceptors=interceptors, **kwargs)
