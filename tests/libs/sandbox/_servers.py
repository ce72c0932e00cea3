"""A loopback TCP server for the egress tests: each connection's first bytes answered transformed, then closed."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable


def echo_server(
    reply: Callable[[bytes], bytes] = bytes.upper,
    *,
    read: int = 64,
    backlog: int = 16,
    accepted: list[socket.socket] | None = None,
) -> tuple[socket.socket, int]:
    """(the listening socket, its port). With ``accepted`` each connection is kept there (the caller closes it) and
    answered from a thread of its own, so many can be open at once; without, one after the other and closed."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(backlog)

    def answer(conn: socket.socket) -> None:
        conn.sendall(reply(conn.recv(read)))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            if accepted is None:
                with conn:
                    answer(conn)
            else:
                accepted.append(conn)
                threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return server, server.getsockname()[1]
