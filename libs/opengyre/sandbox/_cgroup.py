"""A pids cgroup per sandboxed command, where this process may make one: the exact process limit and the exact
set of the command's processes (``setsid``'d and orphaned ones included).

RLIMIT_NPROC cannot stand in for it everywhere: it counts a user's processes, and the kernel exempts the host's
root (a sandbox's user namespace mapped onto uid 0 included). A cgroup is entered by the command's first
process itself (a shell prefix writing its pid to ``cgroup.procs`` before it execs on), never by Python code
between fork and exec: the callers have threads.

Two places are tried, once per process: the cgroup v1 ``pids`` hierarchy, and a cgroup v2 subtree delegated to
this process's cgroup with the ``pids`` controller enabled for its children.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from functools import lru_cache
from pathlib import Path

__all__ = ["PidsCgroup", "pids_cgroup_parent"]

_V1 = Path("/sys/fs/cgroup/pids")
_V2 = Path("/sys/fs/cgroup")
_counter = itertools.count()


def _v2_own() -> Path | None:
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith("0::"):
            return _V2 / line[3:].lstrip("/")
    return None


def _usable(parent: Path) -> bool:
    probe = parent / f"opengyre-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return (probe / "pids.max").exists() and (probe / "cgroup.procs").exists()
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@lru_cache(maxsize=1)
def pids_cgroup_parent() -> Path | None:
    """Where this process can make pids cgroups (probed once), or None."""
    if (_V1 / "cgroup.procs").exists() and _usable(_V1):
        return _V1
    own = _v2_own()
    if own is not None and (_V2 / "cgroup.controllers").exists() and _usable(own):
        return own
    return None


class PidsCgroup:
    """One command's cgroup: ``make()``, the argv prefix that enters it, its processes, ``remove()``."""

    def __init__(self, parent: Path, max_processes: int) -> None:
        self.path = parent / f"opengyre-{os.getpid()}-{next(_counter)}"
        self.max_processes = max_processes

    def make(self) -> None:
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text(str(self.max_processes))
        except OSError:
            self.remove()
            raise

    def prefix(self) -> list[str]:
        # The command's first process writes its own pid, then execs on: everything it starts is counted.
        return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(self.path / "cgroup.procs")]

    def pids(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            return []

    def kill_all(self) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def remove(self, polls: int = 1000) -> None:
        """Kill what is left and remove the cgroup (a killed process leaves it once the kernel has reaped it)."""
        for _ in range(polls):
            self.kill_all()
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.002)
