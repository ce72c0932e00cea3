"""The proxy is the only way out: a namespace sandbox's egress endpoints are reachable at the same loopback
address inside (a streamed response intact and unbuffered, a large body both ways with its end passed on), and
nothing else of the host's network is."""

from __future__ import annotations

import hashlib
import socket
import struct
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits

from ._servers import echo_server


class _Streamer(BaseHTTPRequestHandler):
    """``/stream``: an SSE response whose second event is held back until ``/ack`` says the first arrived."""

    acked = threading.Event()

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/ack":
            type(self).acked.set()
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b"data: first\n\n")
        self.wfile.flush()
        # A relay that held bytes back until the response ended would never let the client ack: the command
        # would hang to its time limit and the test fail.
        got = type(self).acked.wait(60)
        self.wfile.write(b"data: second\n\n" if got else b"data: never-acked\n\n")
        self.wfile.flush()


@pytest.fixture
def streamer() -> Iterator[int]:
    _Streamer.acked = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Streamer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


CLIENT = """
import http.client, sys
port = int(sys.argv[1])
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
conn.request("GET", "/stream")
resp = conn.getresponse()
first = resp.fp.readline().decode().strip()
resp.fp.readline()
ack = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
ack.request("GET", "/ack")
ack.getresponse().read()
rest = resp.read().decode().split()
print(resp.status, first, *rest)
"""

CONNECT = """
import socket, sys
s = socket.socket()
s.settimeout(5)
try:
    s.connect(("127.0.0.1", int(sys.argv[1])))
    print("connected")
except OSError as exc:
    print(type(exc).__name__)
"""


def test_an_egress_endpoint_streams_through_and_nothing_else_is_reachable(streamer: int) -> None:
    other = socket.socket()  # another host service on loopback (NATS, gRPC, an engine)
    other.bind(("127.0.0.1", 0))
    other.listen(4)
    try:
        with LocalSandbox(SandboxLimits(timeout_s=60), egress=[f"127.0.0.1:{streamer}"]) as sb:
            r = sb.run([sys.executable, "-c", CLIENT, str(streamer)])
            blocked = sb.run([sys.executable, "-c", CONNECT, str(other.getsockname()[1])])
    finally:
        other.close()
    assert r.ok and r.isolation == "namespace", r.stderr
    assert r.stdout.split() == ["200", "data:", "first", "data:", "second"]
    assert blocked.stdout.strip() == "ConnectionRefusedError"


ECHO = """
import hashlib, socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
body = bytes(range(256)) * (5 * 4096)  # 5 MiB
s.sendall(body)
s.shutdown(socket.SHUT_WR)  # the end of the request: the host side sees EOF through the relay
reply = b""
while chunk := s.recv(65536):
    reply += chunk
print(reply.decode(), hashlib.sha256(body).hexdigest())
"""


def test_a_large_body_goes_both_ways_with_its_end_passed_on() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def serve() -> None:
        conn, _ = server.accept()
        with conn:
            h, n = hashlib.sha256(), 0
            while chunk := conn.recv(65536):
                h.update(chunk)
                n += len(chunk)
            conn.sendall(f"{n} {h.hexdigest()}".encode())

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    port = server.getsockname()[1]
    try:
        with LocalSandbox(SandboxLimits(timeout_s=60), egress=[f"127.0.0.1:{port}"]) as sb:
            r = sb.run([sys.executable, "-c", ECHO, str(port)])
    finally:
        server.close()
    assert r.ok, r.stderr
    n, got, sent = r.stdout.split()
    assert int(n) == 5 << 20 and got == sent


SEND_ONE = (
    "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=30); "
    "s.sendall(b'x'); print(repr(s.recv(10)))"
)


def _send_one(port: int) -> tuple[bool, str, str]:
    """Inside a sandbox with ``port`` as its egress: connect, send a byte, print what comes back (timed out?, out, err)."""
    with LocalSandbox(SandboxLimits(timeout_s=60), egress=[f"127.0.0.1:{port}"]) as sb:
        r = sb.run([sys.executable, "-c", SEND_ONE, str(port)])
    return r.timed_out, r.stdout.strip(), r.stderr


def test_an_endpoint_that_is_down_is_a_closed_connection_not_a_hang() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    try:  # bound, never listening: connecting is refused
        timed_out, out, err = _send_one(probe.getsockname()[1])
    finally:
        probe.close()
    assert not timed_out
    assert out == "b''" or "ConnectionResetError" in err, err


def test_an_endpoint_that_resets_the_connection_ends_it_inside_too() -> None:
    """A reset on the endpoint's side ends the command's connection as well (the relay passed neither the reset
    nor an end on before: the command's read waited for its own 30 s timeout)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def reset() -> None:
        conn, _ = server.accept()
        conn.recv(1)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close sends an RST
        conn.close()

    t = threading.Thread(target=reset, daemon=True)
    t.start()
    try:
        timed_out, out, err = _send_one(server.getsockname()[1])
    finally:
        server.close()
    assert not timed_out
    assert "TimeoutError" not in err and "timed out" not in err, err
    assert out == "b''" or "ConnectionResetError" in err, (out, err)


def test_egress_is_loopback_and_unprivileged_ports_only_and_the_process_backend_needs_the_host_network() -> None:
    for bad in ("10.0.0.1:80", "example.com:80", "127.0.0.1", "[::1]:8080"):
        with pytest.raises(ValueError):
            LocalSandbox(egress=[bad])
    with pytest.raises(ValueError, match="unprivileged"):
        LocalSandbox(egress=["127.0.0.1:80"])
    with LocalSandbox(egress=["127.0.0.1:8080"], backend="none") as sb, pytest.raises(SandboxError, match="network"):
        sb.run(["true"])


def test_sandboxes_in_many_threads_share_the_relay_and_lose_nothing() -> None:
    """Sandboxes run from threads (the synthesis gates, a cell's executions): each its own sockets, one relay."""
    from concurrent.futures import ThreadPoolExecutor

    server, port = echo_server(lambda b: b[::-1])
    code = (
        "import socket, sys; s = socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=30); "
        "s.sendall(sys.argv[2].encode()); print(s.recv(64).decode())"
    )

    def one(i: int) -> str:
        with LocalSandbox(SandboxLimits(timeout_s=60), egress=[f"127.0.0.1:{port}"]) as sb:
            return sb.run([sys.executable, "-I", "-S", "-c", code, str(port), f"abc{i}"]).stdout.strip()

    try:
        with ThreadPoolExecutor(6) as pool:
            got = list(pool.map(one, range(12)))
    finally:
        server.close()
    assert got == [f"abc{i}"[::-1] for i in range(12)]


FLOOD = """
import socket, sys
path, n = sys.argv[1], int(sys.argv[2])
held = []
for _ in range(n):  # straight to the relay's socket, past the forwarder: no thread of the sandbox's per connection
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    held.append(s)
alive = 0
for s in held:
    s.settimeout(5)
    try:
        s.sendall(b"ping")
        alive += s.recv(4) == b"PING"
    except OSError:
        pass
print(alive)
"""


def test_a_sandbox_holds_at_most_its_egress_connections_at_a_time() -> None:
    """Each relayed connection holds two descriptors of the service (which relays for every sandbox of its
    process) and one of the endpoint (the proxy): a command connecting in a loop must not exhaust them. Past
    ``max_egress_connections`` a connection is closed before anything is opened towards the endpoint; the ones
    within it work."""
    accepted: list[socket.socket] = []
    server, port = echo_server(read=4, backlog=1024, accepted=accepted)
    limits = SandboxLimits(timeout_s=120, max_egress_connections=16)
    try:
        with LocalSandbox(limits, egress=[f"127.0.0.1:{port}"]) as sb:
            r = sb.run([sys.executable, "-c", FLOOD, f"/run/opengyre-egress/{port}.sock", "300"])
    finally:
        server.close()
        for c in accepted:
            c.close()
    assert r.ok, r.output
    assert int(r.stdout) == 16 and len(accepted) == 16, (r.stdout, len(accepted))
