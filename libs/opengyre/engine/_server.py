"""The CPU engine's HTTP face: SGLang's native API, OpenAI routes and admin routes, one module per family."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from opengyre.asgi import Json

from ._admin import admin_routes
from ._common import BadBody, bad_body
from ._engine import CpuEngine
from ._native import native_routes
from ._openai_routes import openai_routes

__all__ = ["build_app"]

_OPEN_PATHS = {"/health", "/health_generate", "/ready"}


def build_app(engine: CpuEngine) -> ASGIApp:
    routes = native_routes(engine) + admin_routes(engine) + openai_routes(engine)
    app = Starlette(routes=routes, exception_handlers={BadBody: bad_body})
    if engine.config.api_key:
        return _BearerAuth(app, engine.config.api_key)
    return app


class _BearerAuth:
    """SGLang's ``--api-key``: every route but health needs ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            if not header.startswith("Bearer "):
                await Json({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
            if header[len("Bearer ") :] != self.key:
                await Json({"error": "Forbidden"}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
