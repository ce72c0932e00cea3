"""A lean HTTP/1.1 client: keep-alive connections, one write per request, streamed bodies with a read timeout.

Shared by the proxy's hop to its engine and svc-bench's load generator, where a general-purpose client
(httpx) costs more CPU per request than the work around it.
"""

from ._pool import Http1ConnectError, Http1Error, Http1Pool, Http1Response, Http1TimeoutError

__all__ = ["Http1ConnectError", "Http1Error", "Http1Pool", "Http1Response", "Http1TimeoutError"]
