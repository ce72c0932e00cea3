"""The trainer's ``/metrics`` HTTP server: prometheus-client's WSGI app on the standard library's threaded server,
within ``HttpLimits`` (prometheus-client's own ``start_http_server`` has no timeout: a client that never finishes its
request holds a thread for ever, and every connection gets one).

The standard library already answers 431 to a header line over 64 KiB and to more than 100 header lines; this adds
the head's total size (431), a deadline for the whole head from the accept (a per-read socket timeout alone lets a
byte every few seconds through; past it the socket is shut and the thread ends) and the connection caps (503 at
the accept). The server speaks HTTP/1.0, one request per connection, and never reads a body.
"""

from __future__ import annotations

import collections
import contextlib
import http.client
import socket
import threading
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from opengyre.config import HttpLimits

__all__ = ["MetricsServer"]

_REFUSAL = (
    b"HTTP/1.0 503 Service Unavailable\r\ncontent-type: text/plain\r\ncontent-length: 20\r\nretry-after: 1\r\n"
    b"connection: close\r\n\r\ntoo many connections"
)


class _HeadReader:
    """The request's stream while its head is read: refuses to hand out more than ``limit`` bytes."""

    def __init__(self, raw: Any, limit: int) -> None:
        self._raw = raw
        self._left = limit

    def readline(self, size: int = -1) -> bytes:
        line: bytes = self._raw.readline(size)
        self._left -= len(line)
        if self._left < 0:
            raise http.client.HTTPException("the request line and headers are over the limit")  # -> 431
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(WSGIRequestHandler):
    limits: HttpLimits  # set on the class per server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.limits.header_timeout_s)  # every read and write, besides the head's deadline
        self._raw_rfile = self.rfile
        self.rfile = _HeadReader(self.rfile, self.limits.max_header_bytes)  # type: ignore[assignment]
        self._expired = False
        self._deadline = threading.Timer(self.limits.header_timeout_s, self._expire)
        self._deadline.daemon = True
        self._deadline.start()

    def handle(self) -> None:
        try:
            super().handle()
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # a client that stopped reading or sending: its thread ends here

    def _expire(self) -> None:
        self._expired = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns: the handler's thread ends

    def parse_request(self) -> bool:
        try:
            return super().parse_request() and not self._expired  # a head cut short by the deadline: no answer
        finally:
            self._deadline.cancel()
            self.rfile = self._raw_rfile

    def finish(self) -> None:
        self._deadline.cancel()
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:  # the stdlib's signature
        """Log nothing (a line per scrape)."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    limits: HttpLimits

    def __init__(self, *args: Any, **kw: Any) -> None:
        self.per_client: collections.Counter[str] = collections.Counter()
        self.admitted: dict[int, str] = {}
        self.refused = 0
        self._lock = threading.Lock()
        super().__init__(*args, **kw)

    def verify_request(self, request: Any, client_address: Any) -> bool:
        client = str(client_address[0])
        with self._lock:
            if (
                len(self.admitted) < self.limits.max_connections
                and self.per_client[client] < self.limits.max_connections_per_client
            ):
                self.per_client[client] += 1
                self.admitted[id(request)] = client
                return True
            self.refused += 1
        with contextlib.suppress(OSError):
            request.sendall(_REFUSAL)
        return False  # the server shuts the socket

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            client = self.admitted.pop(id(request), None)
            if client is not None:
                self.per_client[client] -= 1
                if not self.per_client[client]:
                    del self.per_client[client]
        super().shutdown_request(request)


class MetricsServer:
    """``/metrics`` of ``registry`` on ``addr:port`` (0: any free port) in a daemon thread, until ``close``."""

    def __init__(self, registry: CollectorRegistry, port: int, addr: str, limits: HttpLimits) -> None:
        handler = type("MetricsHandler", (_Handler,), {"limits": limits})
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        server = type("MetricsHttpServer", (_Server,), {"limits": limits, "address_family": family})
        self._server: _Server = make_server(addr, port, make_wsgi_app(registry), server, handler_class=handler)
        self.port = int(self._server.server_port)
        self._thread = threading.Thread(target=self._server.serve_forever, name="trainer-metrics", daemon=True)
        self._thread.start()

    @property
    def refused(self) -> int:
        """Connections refused at the accept (over a connection cap)."""
        return self._server.refused

    @property
    def connections(self) -> int:
        return len(self._server.admitted)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
