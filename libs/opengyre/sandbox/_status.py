"""A command's status channel where no descriptor can be passed in (a container): a Unix socket accepted once.

The launcher inside connects before it starts the command, so the first connection in the listener's queue is
the launcher's: it is the only one accepted, the listener is closed right after (a later connection is refused,
one queued behind it is reset), and only what comes over it is believed. A status file, which the command's
user could write (and then kill the launcher, so that no true status overwrites it), is never used.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from pathlib import Path

__all__ = ["StatusChannel"]

_POLL_S = 0.1  # how often the acceptor looks whether the run has ended without a connection
_MAX = 64  # bytes of a status line ("<wait status>\n")
_READ_GRACE_S = 5.0  # for the launcher's connection to reach its end once the launcher has ended


class StatusChannel:
    """``StatusChannel(path, owner)``: listening at once; ``status()`` once the launcher has ended; ``close()``."""

    def __init__(self, path: Path, owner: tuple[int, int] | None = None) -> None:
        self.path = path
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._listener.bind(str(path))
            if owner is not None:  # a root caller: the container's unprivileged user must connect to it
                os.chown(path, *owner)
            path.chmod(0o600)
            self._listener.listen(1)
            self._listener.settimeout(_POLL_S)
        except OSError:
            self._close_listener()
            raise
        self._ended = threading.Event()
        self._data = bytearray()
        self._accepted = False
        self._thread = threading.Thread(target=self._accept_once, name=f"status-{path.name}", daemon=True)
        self._thread.start()

    def _accept_once(self) -> None:
        try:
            while True:
                # Looked at once more after the launcher has ended: its connection, if it made one, is queued.
                last = self._ended.is_set()
                try:
                    conn, _ = self._listener.accept()
                    break
                except TimeoutError:
                    if last:
                        return
        except OSError:
            return
        finally:
            self._close_listener()  # exactly once: whatever connects or waits behind it is refused
        self._accepted = True
        with conn:
            conn.settimeout(None)  # the launcher ends (and the connection with it) before status() is asked
            with contextlib.suppress(OSError):
                while len(self._data) < _MAX and (chunk := conn.recv(_MAX)):
                    self._data += chunk

    def _close_listener(self) -> None:
        self._listener.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    def status(self) -> int | None:
        """The raw wait status the launcher reported, None where it reported none (it never connected, or was
        killed before it wrote)."""
        self.close()
        if self._thread.is_alive() or not self._accepted:
            return None
        words = bytes(self._data).split()
        try:
            return int(words[0]) if len(words) == 1 and self._data.endswith(b"\n") else None
        except ValueError:
            return None

    def close(self) -> None:
        """Stop listening (and wait a grace for a connection's end); what came is kept for ``status``."""
        self._ended.set()
        self._thread.join(_READ_GRACE_S + _POLL_S)
