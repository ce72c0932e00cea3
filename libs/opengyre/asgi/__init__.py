"""Kernel: the ASGI pieces every HTTP face shares (the proxy's gateway, the CPU engine).

- ``HttpServer``: a Starlette app served by uvicorn inside the running event loop, within ``HttpLimits``.
- ``Refusal`` / ``RequestHead``: what the server refused itself (the bounds uvicorn lacks: head size and count,
  head and body deadlines, body size, connections per client) and the head it had read, for the app's error body.
- ``Json``: the msgspec-encoded JSON response.
"""

from ._http import HttpServer
from ._http_guard import Refusal, RequestHead
from ._json import Json

__all__ = ["HttpServer", "Json", "Refusal", "RequestHead"]
