"""The process backend (``none``): a private directory, limits and a reaper, and the host's view of everything.

Commands run as the current user in a fresh directory tree (``home/`` and ``tmp/`` inside it), with a clean
environment, under a launcher that is their child subreaper (``_reaper.py``): a timeout kills every process they
started, and what they leave running in the background dies when they end, even a process that left their
session or was double-forked. It isolates nothing of the file system, the processes or (with ``network=True``)
the network: the namespace backend does. It is also what runs a command inside one of our namespace sandboxes
(``nested``), whose isolation already holds there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from ._base import BaseSandbox, Mount, SandboxError, Wrapped, end_launcher, limit_prefix, rss_of, session_rss
from ._cgroup import PidsCgroup
from ._isolation import no_network_prefix
from ._limits import SandboxLimits

__all__ = ["ProcessSandbox"]

# The launcher (``_reaper.py``, standard library only) that runs every command as a child subreaper: when the
# command ends, whatever it started ends too, even what left its session (``setsid``) or was orphaned.
_REAPER = str(Path(__file__).with_name("_reaper.py"))


class ProcessSandbox(BaseSandbox):
    """``with ProcessSandbox() as sb: sb.run(["bash", "x.sh"])``; the directory is removed on exit."""

    name = "none"

    def __init__(self, *args: object, nested: bool = False, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._nested = nested

    @property
    def isolation(self) -> str:
        return "nested" if self._nested else self.name

    def _seen(self, m: Mount) -> str:
        return os.path.abspath(m.source)  # no mount namespace: the command sees the host's paths

    def _marker(self) -> dict[str, str]:
        return {"OPENGYRE_IN_SANDBOX": "namespace"} if self._nested else {}

    def _check(self, limits: SandboxLimits) -> None:
        if self.egress and not limits.network and not self._nested:
            # Without a namespace of its own the host's network is the way to an endpoint.
            raise SandboxError("the process sandbox reaches egress endpoints only with network=True")

    def _network_isolated(self, limits: SandboxLimits) -> bool:
        if self._nested:
            return True  # the outer sandbox's network namespace: loopback and its egress only
        return not limits.network and bool(no_network_prefix())

    def _wrap(
        self, command: list[str], limits: SandboxLimits, cwd: str, cgroup: PidsCgroup | None, env: dict[str, str]
    ) -> Wrapped:
        isolation = [] if limits.network or self._nested else no_network_prefix()
        enter = cgroup.prefix() if cgroup is not None else []
        launcher = [sys.executable, "-I", "-S", _REAPER]
        # RLIMIT_NPROC counts all of the user's processes: with a cgroup holding the limit it is left off, but
        # for the host's root, whom the kernel exempts from it (then it only says the limit: ``ulimit -u``).
        nproc = cgroup is None or os.geteuid() == 0
        argv = [*enter, *launcher, *limit_prefix(limits, nproc=nproc), *isolation, *command]
        return Wrapped(argv, Path(cwd))

    def _processes(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> int:
        if cgroup is not None:
            return rss_of([p for p in cgroup.pids() if p != proc.pid])
        return session_rss(proc.pid)

    def _end(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
        end_launcher(proc)
        if cgroup is not None:
            cgroup.kill_all()


def in_namespace_sandbox() -> bool:
    """Whether this process runs inside one of our namespace sandboxes: its marker in the environment, and the
    namespace's init (bwrap) as pid 1."""
    if os.environ.get("OPENGYRE_IN_SANDBOX") != "namespace":
        return False
    try:
        return Path("/proc/1/comm").read_text().strip() == "bwrap"
    except OSError:
        return False
