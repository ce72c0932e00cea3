"""The namespace sandbox's launcher for a command given egress: ``python -I -S _inside.py STATUS SPEC... -- ARGV``.

Inside the sandbox's network namespace (only a loopback) it listens on each ``127.0.0.1:PORT`` of the SPECs
(``127.0.0.1:PORT=/path/to/unix.sock``) and forwards every connection to the Unix socket that the host side of
the sandbox relays to the same address on the host (``_egress.py``); then it starts ARGV, writes ARGV's raw wait
status to FD (how the sandbox tells a signal from an exit code: the namespace's init flattens both) and ends as
ARGV ended. STATUS is a file descriptor the sandbox passed in (the namespace backend), or ``unix:PATH``, a Unix
socket the sandbox listens on and accepts once (the Docker backend, which cannot pass a descriptor into a
container): it is connected before ARGV starts, so the runner's one accepted connection is this launcher's, never
the command's. Standard library only, no site packages; started only for commands given egress.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading

_CHUNK = 1 << 16


def _pump(src: socket.socket, dst: socket.socket, done: threading.Semaphore) -> None:
    # Bytes go on as they come (a streamed response is not held back); the end of one direction is passed on, and
    # a reset ends both (the other direction's recv would otherwise wait on a peer that is gone).
    try:
        while chunk := src.recv(_CHUNK):
            dst.sendall(chunk)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)
    except OSError:
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
    finally:
        done.release()


def _connection(conn: socket.socket, path: str) -> None:
    up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        up.connect(path)
    except OSError:
        up.close()
        conn.close()
        return
    done = threading.Semaphore(0)
    threading.Thread(target=_pump, args=(up, conn, done), daemon=True).start()
    _pump(conn, up, done)
    done.acquire()
    done.acquire()
    conn.close()
    up.close()


def _serve(listener: socket.socket, path: str) -> None:
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=_connection, args=(conn, path), daemon=True).start()


# Ignored here, as the Perl shim ignores them, and restored for the command.
_IGNORED = tuple(getattr(signal, f"SIG{n}") for n in ("HUP", "INT", "QUIT", "TERM", "USR1", "USR2", "ALRM"))


def _guard() -> None:
    """The command runs as this launcher's user in its pid namespace: non-dumpable (no /proc/<pid>/fd, mem or
    ptrace for it: the status descriptor and the forwarding stay out of its reach) and deaf to the signals that
    can be ignored, so only a SIGKILL ends the launcher (the sandbox then says the status is missing)."""
    import ctypes

    if ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0) != 0:  # PR_SET_DUMPABLE
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)


def _status_channel(arg: str) -> int:
    """The descriptor the command's status goes to; never inherited by the command's processes."""
    if arg.startswith("unix:"):
        channel = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # not inheritable (PEP 446)
        try:
            channel.connect(arg[len("unix:") :])
        except OSError:
            channel.close()
            raise
        return channel.detach()
    fd = int(arg)
    os.set_inheritable(fd, False)
    return fd


def main(argv: list[str]) -> int:
    try:
        _guard()
        status_fd = _status_channel(argv[0])
    except OSError as exc:
        print(f"sandbox: status channel: {exc}", file=sys.stderr)
        return 125
    split = argv.index("--")
    specs, command = argv[1:split], argv[split + 1 :]
    for spec in specs:
        address, path = spec.split("=", 1)
        host, port = address.rsplit(":", 1)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, int(port)))
        except OSError as exc:
            print(f"sandbox: cannot listen on {address} for egress: {exc}", file=sys.stderr)
            return 125
        listener.listen(128)
        os.set_inheritable(listener.fileno(), False)
        threading.Thread(target=_serve, args=(listener, path), daemon=True).start()
    try:
        # Its own process group: a command's ``kill 0`` must not end the forwarder. Python's ignored SIGPIPE and
        # SIGXFSZ go back to their defaults for the command, as subprocess's restore_signals does.
        child = os.posix_spawn(
            command[0],
            command,
            os.environ,
            setpgroup=0,
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, *_IGNORED),
            setsigmask=(),
        )
    except OSError as exc:
        print(f"sandbox: cannot start {command[0]!r}: {exc}", file=sys.stderr)
        return 127
    _, status = os.waitpid(child, 0)
    with contextlib.suppress(OSError):
        os.write(status_fd, f"{status}\n".encode())
    return 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.stdout.flush()
    os._exit(main(sys.argv[1:]))  # the forwarding threads end with the sandbox, not before
