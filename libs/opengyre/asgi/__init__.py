"""Kernel: the ASGI pieces every HTTP face shares (the proxy's gateway, the CPU engine).

- ``HttpServer``: a Starlette app served by uvicorn inside the running event loop, within ``HttpLimits``.
- ``ConnectionGuard`` / ``guarded_protocol`` / ``Refusal`` / ``RequestHead``: the bounds uvicorn lacks (head size
  and count, head and body deadlines, body size, connections per client); ``LINGER_S``.
- ``Json``: the msgspec-encoded JSON response.
"""

from ._http import HttpServer
from ._http_guard import LINGER_S, ConnectionGuard, Refusal, RequestHead, guarded_protocol
from ._json import Json

__all__ = ["LINGER_S", "ConnectionGuard", "HttpServer", "Json", "Refusal", "RequestHead", "guarded_protocol"]
