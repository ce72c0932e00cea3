"""The sandbox's launcher: ``python -I -S _reaper.py ARGV...`` runs ARGV and outlives nothing it started.

It makes itself a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4, no privilege needed), so
every process ARGV starts, however it detaches (``setsid``, a double fork), is reparented to it when its own
parent dies, never to init. When ARGV exits (or a SIGTERM from the sandbox asks it to end) it SIGKILLs whatever
is left in its tree, reaps it, and ends as ARGV ended (the same exit code, or the same signal). A process group
or session cannot do this (``setsid`` leaves both), nor can an ancestry walk of /proc (a double fork's orphan
has init as its parent); a cgroup could, but needs privilege or a delegated hierarchy.

Standard library only, no site packages: it starts once per sandboxed command (~15 ms).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import sys

_PR_SET_CHILD_SUBREAPER = 36


def _children(me: int) -> list[int]:
    """Ids of this process's children (from /proc: a kernel without CONFIG_PROC_CHILDREN has no children file)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        if int(stat[stat.rfind(b")") + 2 :].split(maxsplit=2)[1]) == me:
            out.append(int(name))
    return out


def _kill_everything(me: int) -> None:
    """SIGKILL and reap every process left in the tree. A killed process's orphans are reparented to this one
    before the killed process can be reaped, so a scan after each reap sees them: the loop ends with none left."""
    while True:
        try:  # most commands leave nothing behind: no /proc scan then
            if os.waitpid(-1, os.WNOHANG)[0] != 0:
                continue
        except ChildProcessError:
            return
        kids = _children(me)
        for pid in kids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            pid, _ = os.waitpid(-1, 0 if kids else os.WNOHANG)
        except ChildProcessError:
            return


def main(argv: list[str]) -> int:
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        print(f"sandbox: prctl(PR_SET_CHILD_SUBREAPER) failed: errno {ctypes.get_errno()}", file=sys.stderr)
        return 125
    # It re-raises the command's signal at the end: no core file of its own for a SIGSEGV.
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    # SIGTERM (the sandbox asking it to end) is held until the handler below knows the child.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        # Its own process group: a command's ``kill 0`` must not reach this launcher. Python's ignored SIGPIPE and
        # SIGXFSZ go back to their defaults, as subprocess's restore_signals does.
        child = os.posix_spawn(
            argv[0], argv, os.environ, setpgroup=0, setsigdef=(signal.SIGPIPE, signal.SIGXFSZ), setsigmask=()
        )
    except OSError as exc:
        print(f"sandbox: cannot start {argv[0]!r}: {exc}", file=sys.stderr)
        return 127

    def end(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child, signal.SIGKILL)

    signal.signal(signal.SIGTERM, end)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    me = os.getpid()
    while True:
        pid, status = os.waitpid(-1, 0)  # an orphan reparented here may be reaped first
        if pid == child:
            break
    _kill_everything(me)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig != signal.SIGKILL:  # whose disposition cannot be set (nor needs to be)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(me, sig)
    return os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 128 + os.WTERMSIG(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
