"""A pids cgroup per sandboxed command, where this process may make one: the exact process limit and the exact
set of the command's processes (``setsid``'d and orphaned ones included).

RLIMIT_NPROC cannot stand in for it everywhere: it counts a user's processes, and the kernel exempts the host's
root (a sandbox's user namespace mapped onto uid 0 included). A cgroup is entered by the command's first
process itself (a shell prefix writing its pid to ``cgroup.procs`` before it execs on), never by Python code
between fork and exec: the callers have threads.

Two places are tried, once per process: the cgroup v1 ``pids`` hierarchy, and a cgroup v2 subtree delegated to
this process's cgroup with the ``pids`` controller enabled for its children.

Beside it, where one can be made, a memory cgroup of the command's own (cgroup v1: under this process's own in the
``memory`` hierarchy; v2: the same cgroup, where the ``memory`` controller is enabled too): its ``oom_kill`` count
is the OOM kills of the command's processes alone (``SandboxResult.oom_kills``), not the machine's.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import os
import signal
import threading
import time
from functools import lru_cache
from pathlib import Path

__all__ = ["PidsCgroup", "memory_cgroup_parent", "pids_cgroup_parent"]

_V1 = Path("/sys/fs/cgroup/pids")
_V1_MEMORY = Path("/sys/fs/cgroup/memory")
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


def _v1_own(controller: str) -> Path | None:
    """This process's cgroup in the v1 hierarchy of ``controller`` (``N:memory:/path``), or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            own = _V1_MEMORY / path.lstrip("/")
            return own if own.is_dir() else _V1_MEMORY  # a cgroup namespace shows its own root as /
    return None


def _usable(parent: Path, *files: str) -> bool:
    probe = parent / f"opengyre-probe-{os.getpid()}"
    try:
        probe.mkdir()
    except OSError:
        return False
    try:
        return all((probe / f).exists() for f in (*files, "cgroup.procs"))
    finally:
        with contextlib.suppress(OSError):
            probe.rmdir()


@lru_cache(maxsize=1)
def pids_cgroup_parent() -> Path | None:
    """Where this process can make pids cgroups (probed once), or None."""
    if (_V1 / "cgroup.procs").exists() and _usable(_V1, "pids.max"):
        return _V1
    own = _v2_own()
    if own is not None and (_V2 / "cgroup.controllers").exists() and _usable(own, "pids.max"):
        return own
    return None


@lru_cache(maxsize=1)
def memory_cgroup_parent() -> Path | None:
    """Where this process can make memory cgroups (probed once): v1's ``memory`` hierarchy under its own cgroup,
    or v2's own cgroup when its children get the ``memory`` controller (then the pids cgroup is the memory one
    too: ``PidsCgroup.memory`` is its own path). None: the OOM kills can only be counted machine-wide."""
    own = _v1_own("memory") if (_V1_MEMORY / "cgroup.procs").exists() else None
    if own is not None and _usable(own, "memory.oom_control"):
        return own
    v2 = _v2_own()
    if v2 is not None and (_V2 / "cgroup.controllers").exists() and _usable(v2, "memory.events", "pids.max"):
        return v2
    return None


class _Groups:
    """The shared memory cgroups of this process (``SandboxLimits.memory_group``), made with their first member
    and removed with their last: name -> (cgroup, members)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[str, tuple[Path, int]] = {}

    def join(self, parent: Path, name: str, limit: int, v2: bool) -> Path:
        digest = hashlib.sha256(name.encode()).hexdigest()[:16]  # any name: a group id, a path, spaces
        with self._lock:
            path, members = self._groups.get(name, (parent / f"opengyre-group-{os.getpid()}-{digest}", 0))
            if members == 0:
                path.mkdir(exist_ok=True)
                try:
                    if v2:  # its children get both controllers: they are the members' pids and memory cgroups
                        (path / "cgroup.subtree_control").write_text("+pids +memory")
                    PidsCgroup._limit_memory(path, limit)
                except OSError:
                    with contextlib.suppress(OSError):
                        path.rmdir()
                    raise
            self._groups[name] = (path, members + 1)
            return path

    def leave(self, name: str) -> None:
        with self._lock:
            path, members = self._groups[name]
            if members > 1:
                self._groups[name] = (path, members - 1)
                return
            del self._groups[name]
            with contextlib.suppress(OSError):
                path.rmdir()


_groups = _Groups()


class PidsCgroup:
    """One command's cgroup: ``make()``, the argv prefix that enters it, its processes, ``remove()``."""

    def __init__(
        self,
        parent: Path,
        max_processes: int | None,
        memory_parent: Path | None = None,
        memory_max: int | None = None,
        group: str | None = None,
    ) -> None:
        """``group``: the shared memory cgroup's name (``memory_group``), whose limit is ``memory_max``: the
        command's memory cgroup (and, on v2, its pids cgroup, the same) nests in it, with no limit of its own."""
        self.name = f"opengyre-{os.getpid()}-{next(_counter)}"
        self.group = group
        self._joined = False
        if group is not None:
            if memory_parent is None:
                raise OSError(errno.ENOTSUP, "no memory cgroup can be made here")
            v2 = memory_parent == parent
            memory_parent = _groups.join(memory_parent, group, memory_max or 0, v2)
            self._joined = True
            parent = memory_parent if v2 else parent
            memory_max = None
        self.path = parent / self.name
        self.max_processes = max_processes
        # The command's memory cgroup: its own in v1's memory hierarchy, or this one (v2, both controllers).
        self.memory = None if memory_parent is None else memory_parent / self.name
        self.memory_max = memory_max  # bytes: the kernel's limit on the memory cgroup, swap included (None: none)

    def make(self) -> None:
        self.path.mkdir()
        try:
            (self.path / "pids.max").write_text("max" if self.max_processes is None else str(self.max_processes))
            if self.memory is not None and self.memory != self.path:
                self.memory.mkdir()
            if self.memory is not None and self.memory_max is not None:
                if (self.memory / "memory.oom.group").exists():
                    self._limit_memory(self.memory, self.memory_max)
                else:
                    # cgroup v1 has no oom.group: the kernel would kill one process and let the rest of the
                    # command go on (a shell printing after its child died). The sandbox's own watcher, which
                    # kills the whole tree, enforces the command's budget there; a shared group's limit stays.
                    self.memory_max = None
        except OSError:
            self.remove()
            raise

    def prefix(self) -> list[str]:
        # The command's first process writes its own pid, then execs on: everything it starts is counted.
        procs = [str(self.path / "cgroup.procs")]
        if self.memory is not None and self.memory != self.path:
            procs.append(str(self.memory / "cgroup.procs"))
        enter = " && ".join(f'echo $$ > "${i}"' for i in range(len(procs)))
        return ["/bin/sh", "-c", f'{enter} && shift {len(procs) - 1} && exec "$@"' if len(procs) > 1 else
                f'{enter} && exec "$@"', *procs]  # fmt: skip

    @staticmethod
    def _limit_memory(path: Path, limit: int) -> None:
        if (path / "memory.max").exists():  # v2; no swap beyond it
            (path / "memory.max").write_text(str(limit))
            if (path / "memory.swap.max").exists():
                (path / "memory.swap.max").write_text("0")
            if (path / "memory.oom.group").exists():  # an OOM kill takes the whole command, as a container's
                (path / "memory.oom.group").write_text("1")
            return
        (path / "memory.limit_in_bytes").write_text(str(limit))  # v1: memory first, then memory + swap
        if (path / "memory.memsw.limit_in_bytes").exists():
            (path / "memory.memsw.limit_in_bytes").write_text(str(limit))

    def oom_kills(self) -> int | None:
        """The OOM kills of the command's processes so far (its memory cgroup's ``oom_kill``), None without one."""
        if self.memory is None:
            return None
        for name in ("memory.events", "memory.oom_control"):  # v2, v1
            try:
                lines = (self.memory / name).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return None

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
        for path in [self.path] + ([self.memory] if self.memory not in (None, self.path) else []):
            for _ in range(polls):
                self.kill_all()
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002)
        if self._joined and self.group is not None:
            self._joined = False
            _groups.leave(self.group)
