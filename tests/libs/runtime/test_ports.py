"""A port is free when a server can listen on it: connections a closed server left in TIME_WAIT do not make it
taken (a stack restarted after a crash keeps its explicit ports), a listener does."""

from __future__ import annotations

import socket

from opengyre.runtime import port_is_free


def _time_wait_port() -> int:
    """A port whose listener is closed but holds a connection in TIME_WAIT (the server closed it first)."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = int(listener.getsockname()[1])
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server's side closes first: it is the one left in TIME_WAIT
        assert client.recv(1) == b""
        client.close()
    return port


def _time_wait_on(port: int) -> bool:
    with open("/proc/net/tcp") as f:
        rows = [line.split() for line in f.readlines()[1:]]
    return any(int(r[1].split(":")[1], 16) == port and r[3] == "06" for r in rows)  # 06: TIME_WAIT


def test_a_port_left_in_time_wait_is_free_and_a_listening_one_is_not() -> None:
    port = _time_wait_port()
    assert _time_wait_on(port)
    assert port_is_free(port)
    with socket.socket() as server:  # what a restarted server does, and why the port is free
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", port))
        server.listen()
        assert not port_is_free(port)
