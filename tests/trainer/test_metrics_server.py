"""The trainer's /metrics server within HttpLimits (issue 24 item 5), over real sockets: scraped as before; a head
that never ends is cut at the header timeout; an oversized head is 431; connections over a cap get 503 while
another client is still served. Each waits on the socket (its end, an answer), never on the clock."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Gauge

from opengyre.config import HttpLimits
from opengyre.trainer._metrics_server import MetricsServer

from .._polling import wait_until


@contextlib.contextmanager
def serving(limits: HttpLimits) -> Iterator[MetricsServer]:
    registry = CollectorRegistry()
    Gauge("opengyre_test_value", "A value.", registry=registry).set(3)
    srv = MetricsServer(registry, 0, "127.0.0.1", limits)
    try:
        yield srv
    finally:
        srv.close()


def connect(srv: MetricsServer, source: str = "127.0.0.1") -> socket.socket:
    return socket.create_connection(("127.0.0.1", srv.port), source_address=(source, 0))


def read_all(sock: socket.socket) -> bytes:
    """Everything up to the server's close."""
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def test_metrics_are_served() -> None:
    with serving(HttpLimits()) as srv:
        r = httpx.get(f"http://127.0.0.1:{srv.port}/metrics")
        assert r.status_code == 200 and "opengyre_test_value 3.0" in r.text


def test_a_head_that_never_ends_is_cut_at_the_header_timeout() -> None:
    with serving(HttpLimits(header_timeout_s=0.3)) as srv:
        sock = connect(srv)
        sock.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n")
        stop = threading.Event()

        def trickle() -> None:
            with contextlib.suppress(OSError):
                while not stop.wait(0.05):
                    sock.sendall(b"x")  # a header byte every 50 ms, never the end of it

        t = threading.Thread(target=trickle, daemon=True)
        t.start()
        try:
            assert read_all(sock) == b""  # closed unanswered: the thread serving it has ended
        finally:
            stop.set()
            t.join()
            sock.close()
        wait_until(lambda: srv.connections == 0, "the connection released")


def test_an_oversized_head_is_431() -> None:
    with serving(HttpLimits(max_header_bytes=4096)) as srv:
        sock = connect(srv)
        sock.sendall(b"GET /metrics HTTP/1.1\r\n" + b"".join(b"x-%d: %s\r\n" % (i, b"v" * 100) for i in range(60)))
        answer = read_all(sock)
        sock.close()
        assert answer.startswith(b"HTTP/1.0 431"), answer[:80]


@pytest.mark.parametrize("cap", ["per_client", "total"])
def test_connections_over_a_cap_get_503_while_another_client_is_served(cap: str) -> None:
    limits = (
        HttpLimits(max_connections_per_client=2, header_timeout_s=60)
        if cap == "per_client"
        else HttpLimits(max_connections=2, header_timeout_s=60)
    )
    with serving(limits) as srv:
        held = [connect(srv) for _ in range(2)]
        try:
            wait_until(lambda: srv.connections == 2, "both connections admitted")
            extra = connect(srv)
            answer = read_all(extra)
            extra.close()
            assert answer.startswith(b"HTTP/1.0 503") and b"retry-after: 1" in answer
            assert srv.refused == 1
            if cap == "per_client":  # another address is still served
                other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2"))
                assert other.get(f"http://127.0.0.1:{srv.port}/metrics").status_code == 200
                other.close()
        finally:
            for s in held:
                s.close()
        wait_until(lambda: srv.connections == 0, "the held connections released")
        assert httpx.get(f"http://127.0.0.1:{srv.port}/metrics").status_code == 200
