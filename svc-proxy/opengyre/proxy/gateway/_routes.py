"""The gateway's route table (each dialect's routes under an execution's base URL and under ``/v1``), the model
lists in each dialect's shape, and which dialect a request speaks when its route does not say (the error shape
of an unknown route, of a model list, of a refusal the HTTP server answered itself)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opengyre.asgi import RequestHead
from opengyre.wire import ApiError
from opengyre.wire import openai as openai_api

from ..dialects._dialects import ANTHROPIC, CHAT, COMPLETIONS, RESPONSES, Dialect

__all__ = ["build_app", "head_speaks_anthropic", "model_body", "models_body", "speaks_anthropic"]

Handler = Callable[[Request], Awaitable[Response]]
_CREATED = "2026-01-01T00:00:00Z"  # Anthropic's model objects carry a creation time; ours have none


def speaks_anthropic(request: Request) -> bool:
    """A request from an Anthropic client (the two APIs share ``/v1``): its version header, or its key header
    (OpenAI clients send ``Authorization: Bearer``)."""
    return "anthropic-version" in request.headers or "x-api-key" in request.headers


def head_speaks_anthropic(head: RequestHead) -> bool:
    """``speaks_anthropic`` for a request the HTTP server refused before the app saw it (its path counts too)."""
    names = {name for name, _ in head.headers}
    return b"anthropic-version" in names or b"x-api-key" in names or head.path.endswith(("/messages", "/count_tokens"))


def models_body(names: list[str], *, anthropic: bool) -> dict[str, Any]:
    """``GET /v1/models`` in the caller's dialect."""
    if not anthropic:
        return openai_api.models_body(names)
    data = [{"type": "model", "id": n, "display_name": n, "created_at": _CREATED} for n in names]
    return {
        "data": data,
        "has_more": False,
        "first_id": names[0] if names else None,
        "last_id": names[-1] if names else None,
    }


def model_body(name: str, *, anthropic: bool) -> dict[str, Any]:
    """``GET /v1/models/{model}`` in the caller's dialect."""
    if anthropic:
        return {"type": "model", "id": name, "display_name": name, "created_at": _CREATED}
    return {"id": name, "object": "model", "created": 0, "owned_by": "opengyre"}


def build_app(
    *,
    call: Callable[[Request, Dialect], Awaitable[Response]],
    count_tokens: Handler,
    models: Handler,
    model: Handler,
    health: Handler,
    metrics: Handler,
    error: Callable[[ApiError, Dialect], Response],
) -> Starlette:
    """The Starlette app: every dialect's call route goes to ``call`` with its dialect; ``error`` answers an
    unknown route or method in the caller's dialect."""

    def call_route(dialect: Dialect) -> Handler:
        async def route(request: Request) -> Response:
            return await call(request, dialect)

        return route

    chat, completions, messages = call_route(CHAT), call_route(COMPLETIONS), call_route(ANTHROPIC)
    responses = call_route(RESPONSES)
    routes: list[Route] = [Route("/health", health, methods=["GET"]), Route("/metrics", metrics, methods=["GET"])]
    for base in ("/x/{execution_id}/v1", "/v1"):
        routes += [
            Route(f"{base}/chat/completions", chat, methods=["POST"]),
            Route(f"{base}/completions", completions, methods=["POST"]),
            Route(f"{base}/responses", responses, methods=["POST"]),
            Route(f"{base}/messages", messages, methods=["POST"]),
            Route(f"{base}/messages/count_tokens", count_tokens, methods=["POST"]),
            Route(f"{base}/models", models, methods=["GET"]),
            Route(f"{base}/models/{{model:path}}", model, methods=["GET"]),
        ]

    async def unknown(request: Request, exc: Exception) -> Response:
        """No such route (or method): the dialect's JSON error, never a plain-text page."""
        status = getattr(exc, "status_code", 404)
        anthropic = speaks_anthropic(request) or request.url.path.endswith(("/messages", "/count_tokens"))
        what = "method" if status == 405 else "route"
        err = ApiError(
            status,
            "not_found" if status == 404 else "invalid_request",
            f"no {what} {request.method} {request.url.path} on this server",
            code="unknown_url" if status == 404 else None,
        )
        return error(err, ANTHROPIC if anthropic else CHAT)

    return Starlette(routes=routes, exception_handlers={HTTPException: unknown})
