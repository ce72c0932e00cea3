"""One user of a data dir at a time: an OS file lock on ``<data dir>/stack.lock``.

Whoever serves the data dir's JetStream store holds it for its whole life: the supervisor of ``opengyre up``,
or a command that reads the log of a stopped stack through a temporary nats-server. The kernel releases it
when the holder dies, SIGKILL included, so a dead stack never blocks a new one, and two nats-servers never
share one store. The file's content (pid, role) only explains who holds it; the lock itself is the truth.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["DataDirBusy", "DataDirLock", "DataDirUnusable", "check_data_dir", "describe_holder"]

LOCK_NAME = "stack.lock"


class DataDirBusy(RuntimeError):
    """Another process holds the data dir."""

    def __init__(self, data_dir: Path, holder: dict[str, Any]) -> None:
        self.holder = holder
        who = describe_holder(holder)
        hint = "stop it with `opengyre down`" if holder.get("role") == "up" else "wait for it to finish"
        super().__init__(f"{data_dir} is in use by {who}; {hint}")


class DataDirUnusable(RuntimeError):
    """The data dir cannot be created or written (missing parent, a file in the way, read-only, permissions)."""


def describe_holder(holder: dict[str, Any]) -> str:
    pid = holder.get("pid", "?")
    if holder.get("role") == "up":
        return f"a running stack (supervisor pid {pid})"
    if holder.get("command"):
        return f"`{holder['command']}` (pid {pid})"
    return f"another process (pid {pid})"


def check_data_dir(data_dir: Path, *, create: bool) -> None:
    """A clear error instead of a traceback when the data dir cannot be used; ``create`` makes it (writable)."""
    if not create:
        if data_dir.exists() and not data_dir.is_dir():
            raise DataDirUnusable(f"data dir {data_dir} is not a directory")
        return
    try:
        # Private to its user (its secrets, the proxy's outbox and the stores are nobody else's to read or write).
        data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    except FileExistsError:
        raise DataDirUnusable(f"data dir {data_dir} is not a directory") from None
    except OSError as exc:
        raise DataDirUnusable(f"cannot create data dir {data_dir}: {exc.strerror or exc}") from None
    # One that existed before (made by hand, or by an older build, with the umask's mode) is narrowed: mkdir's
    # mode applies only to what it creates, and the stores, the logs and the tasks' solutions under it are made
    # with the umask's mode, readable by every local user through a 0755 data dir.
    st = data_dir.stat()
    if st.st_mode & 0o077 and st.st_uid == os.geteuid():
        with contextlib.suppress(OSError):  # a read-only file system: the probe below says so
            data_dir.chmod(stat.S_IMODE(st.st_mode) & 0o700)
    probe = data_dir / f".write-test-{os.getpid()}"
    try:
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        why = "read-only file system" if exc.errno == errno.EROFS else (exc.strerror or str(exc))
        raise DataDirUnusable(f"data dir {data_dir} is not writable: {why}") from None


class DataDirLock:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.path = data_dir / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self, role: str, command: str = "", *, wait: float = 2.0) -> None:
        """Take the lock or raise ``DataDirBusy``. ``wait`` only covers another process's probe (``holder``)."""
        check_data_dir(self.data_dir, create=True)
        try:
            # Not inherited by children (PEP 446): a leftover child must not keep a dead stack's lock.
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise DataDirUnusable(f"cannot open {self.path}: {exc.strerror or exc}") from None
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _read(fd)
                    os.close(fd)
                    raise DataDirBusy(self.data_dir, holder) from None
                time.sleep(0.02)
        info = {"pid": os.getpid(), "role": role, "command": command or " ".join(["opengyre", *sys.argv[1:3]])}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the lock
        self._fd = None

    def holder(self) -> dict[str, Any] | None:
        """Who holds the lock now (pid, role, command), or None. Takes nothing: a shared lock for an instant."""
        if self._fd is not None:
            return {"pid": os.getpid(), "role": "self"}
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise DataDirUnusable(f"cannot read {self.path}: {exc.strerror or exc}") from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return _read(fd)
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read(fd: int) -> dict[str, Any]:
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
