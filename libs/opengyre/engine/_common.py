"""What every route family of the CPU engine shares: reading a JSON body and SGLang's error shapes."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from opengyre.asgi import Json

__all__ = ["BadBody", "bad_body", "gate_error", "json_body", "native_error"]


def native_error(message: str, status: int = 400) -> Response:
    return Json({"error": {"message": message}}, status_code=status)


def gate_error(message: str) -> Response:
    # SGLang's request contract gate answers with a flat string.
    return Json({"error": message}, status_code=400)


class BadBody(ValueError):
    """A body that is not JSON: every route answers 400 (the app's handler), never 500."""


async def json_body(request: Request) -> Any:
    try:
        raw = await request.body()
    except ClientDisconnect:  # gone, or cut by the server (a body over the limit, stalled): nobody reads this
        raise BadBody("the client left before its body was read") from None
    try:
        return msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError as exc:
        raise BadBody(f"malformed JSON body: {exc}") from None


async def bad_body(request: Request, exc: Exception) -> Response:
    return native_error(str(exc))
