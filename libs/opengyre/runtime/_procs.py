"""Child processes that die with their parent, and telling our own processes from whatever reuses a pid."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

__all__ = ["alive", "cmdline", "spawn", "stop_group"]

_TRAMPOLINE = Path(__file__).with_name("_pdeath.py")
_LINUX = sys.platform.startswith("linux")


def spawn(
    argv: Sequence[str],
    *,
    die_with_parent: bool = True,
    stdout: int | IO[Any] | None = None,
    stderr: int | IO[Any] | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a session (and process group) of its own; with ``die_with_parent`` it gets SIGTERM
    when this process dies, SIGKILL included (Linux).

    Call it from a thread that lives as long as the child should: the kernel's parent-death signal follows the
    *thread* that forked, so a child started from a worker thread of ``asyncio.to_thread`` would be signalled
    when that worker ends. The supervisor spawns from its event-loop thread.
    """
    args = list(argv)
    if die_with_parent and _LINUX:
        args = [sys.executable, "-I", "-S", str(_TRAMPOLINE), str(os.getpid()), str(int(signal.SIGTERM)), *args]
    if die_with_parent and threading.current_thread() is not threading.main_thread():
        # Only the main thread is sure to outlive the child (see above).
        raise RuntimeError("spawn(die_with_parent=True) must be called from the main thread")
    # Its own session: a Ctrl-C meant for the CLI reaches only the supervisor, which stops children in order,
    # and stopping a child's process group also stops what the child started.
    return subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, env=env, start_new_session=True
    )


def cmdline(pid: int) -> list[str] | None:
    """A live process's argv; None when it is gone or a zombie (which ``kill(pid, 0)`` reports as alive)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    if state in ("Z", "X") or not raw:
        return None
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")]


def alive(pid: int) -> bool:
    if pid <= 0:
        return False
    if _LINUX:
        return cmdline(pid) is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pid: int, timeout: float = 10.0) -> bool:
    """SIGTERM the process group led by ``pid`` (our children lead their own), SIGKILL it after ``timeout``;
    True once ``pid`` is gone. Not our child (a leftover): poll for it, as its reaper is someone else."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
            if sig == signal.SIGTERM:
                os.killpg(pid, signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not alive(pid):
                return True
            time.sleep(0.05)
    return not alive(pid)
