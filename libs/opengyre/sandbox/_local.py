"""The local process sandbox: a private temp dir, time and memory limits, no network where the OS allows.

It is the embedded default beside Docker/Harbor environments: commands run as the current user in a fresh
directory tree (``home/`` and ``tmp/`` inside it), with a clean environment, under a launcher that is their
child subreaper (``_reaper.py``): a timeout kills every process they started, and what they leave running in the
background dies when they end, even a process that left their session or was double-forked.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO

from ._isolation import no_network_prefix
from ._limits import SandboxLimits, SandboxResult

__all__ = ["LocalSandbox", "SandboxError"]

_BASE_ENV = ("LANG", "LC_ALL", "TZ")
# A container's standard PATH (Debian's, which the Docker images we build on keep). The sandbox stands in for
# such a substrate, so its programs come first; the host's own PATH follows, so nothing it finds goes missing.
# Without this a host's version-manager shims shadow the system's programs: a pyenv ``python3`` is a bash
# script that runs ~40 processes before the interpreter (~0.1 CPU-s for each grader or solution started).
_SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


# The launcher (``_reaper.py``, standard library only) that runs every command as a child subreaper: when the
# command ends, whatever it started ends too, even what left its session (``setsid``) or was orphaned.
_REAPER = str(Path(__file__).with_name("_reaper.py"))
_LAUNCHER_GRACE_S = 10.0  # for the launcher to kill and reap the command's tree once asked to
_PIPE_GRACE_S = 5.0  # for the output readers to reach the end of pipes the command's tree no longer holds


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up or could not start the command (an infrastructure failure)."""


def _limit_prefix(limits: SandboxLimits) -> list[str]:
    """argv prefix applying the resource limits.

    ``prlimit`` (util-linux) or a shell's ``ulimit`` set them in the child before it execs the command.
    A ``preexec_fn`` would run Python between fork and exec, which can deadlock or crash in a process with
    threads (a gRPC server, the engine); these prefixes keep the child free of Python.
    """
    caps: list[tuple[str, int, str]] = [("--core", 0, "ulimit -c 0")]
    if limits.memory_mb is not None:  # ulimit -v counts KiB
        caps.append(("--as", limits.memory_mb * 1024 * 1024, f"ulimit -v {limits.memory_mb * 1024}"))
    if limits.cpu_s is not None:
        caps.append(("--cpu", limits.cpu_s, f"ulimit -t {limits.cpu_s}"))
    if limits.max_processes is not None:
        # The process limit is ``-u`` in bash and ``-p`` in dash (a Debian /bin/sh), where ``-u`` is an error.
        n = limits.max_processes
        caps.append(("--nproc", n, f"ulimit -u {n} 2>/dev/null || ulimit -p {n}"))
    prlimit = shutil.which("prlimit") if limits.limiter != "ulimit" else None
    if limits.limiter == "prlimit" and prlimit is None:
        raise SandboxError("sandbox unavailable: prlimit is not installed")
    if prlimit is not None:
        return [prlimit, *(f"{flag}={value}" for flag, value, _ in caps), "--"]
    script = "; ".join(command for _, _, command in caps)
    return ["/bin/sh", "-c", script + '; exec "$@"', "sandbox"]


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _group_rss(session: int) -> int:
    """Resident bytes of every process in ``session`` (the command's: it runs in a session of its own), but
    the session's leader, the sandbox's launcher.

    Every process on the machine is looked at (a process the command orphaned keeps its session but leaves the
    command's tree), several times a second while a command runs: raw ``os.open``/``os.read`` instead of a
    buffered file object halves what a poll costs (~0.7 ms instead of ~1.4 ms with ~170 processes)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fd = os.open(f"/proc/{name}/stat", os.O_RDONLY)
        except OSError:
            continue  # gone meanwhile
        try:
            stat = os.read(fd, 4096)
        except OSError:
            continue
        finally:
            os.close(fd)
        # After "pid (comm) ": state ppid pgrp session ... rss is field 24 (index 21 from state).
        fields = stat[stat.rfind(b")") + 2 :].split(maxsplit=22)
        if len(fields) > 21 and int(fields[3]) == session and int(name) != session:  # not the launcher
            total += int(fields[21]) * page
    return total


def _collect(
    proc: subprocess.Popen[bytes], stdin: bytes | None, limits: SandboxLimits
) -> tuple[bytes, bytes, bool, bool]:
    """``communicate`` (the exit, within the timeout, then both pipes to their end; on timeout the launcher
    kills the command's whole tree), keeping only the first ``max_output_bytes`` of each stream as they come:
    a command that prints without end cannot fill this process's memory. With ``group_memory_mb`` the
    command's processes are watched and killed together past it.
    Returns (stdout, stderr, timed out, memory exceeded)."""
    timeout_s, keep = limits.timeout_s, limits.max_output_bytes
    budget = limits.group_memory_mb * 1024 * 1024 if limits.group_memory_mb is not None else None
    deadline = time.monotonic() + timeout_s
    out, err = bytearray(), bytearray()
    assert proc.stdout is not None and proc.stderr is not None
    workers = [
        threading.Thread(target=_drain, args=(proc.stdout, keep, out), daemon=True),
        threading.Thread(target=_drain, args=(proc.stderr, keep, err), daemon=True),
    ]
    if stdin is not None:
        workers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
    for w in workers:
        w.start()
    timed_out = exceeded = False
    while True:
        left = deadline - time.monotonic()
        try:
            proc.wait(max(left, 0.0) if budget is None else min(max(left, 0.0), limits.memory_poll_s))
            break  # the command's end is its launcher's exit, whoever else still holds the pipes open
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            timed_out = True
            break
        if budget is not None and _group_rss(proc.pid) > budget:
            exceeded = True
            break
    if timed_out or exceeded:
        _end(proc)
    # The launcher killed everything the command started, so the pipes are at their end; a reader that is not
    # (a descriptor passed out of the tree) is left behind rather than holding the result.
    for w in workers:
        w.join(_PIPE_GRACE_S)
    return bytes(out), bytes(err), timed_out, exceeded


def _drain(stream: IO[bytes], keep: int, sink: bytearray) -> None:
    with stream:
        while chunk := os.read(stream.fileno(), 1 << 16):
            if len(sink) < keep:
                sink += chunk[: keep - len(sink)]


def _feed(stream: IO[bytes] | None, data: bytes) -> None:
    assert stream is not None
    # The command may exit (or close its stdin) without reading it all: a broken pipe is its business.
    with contextlib.suppress(OSError), stream:
        stream.write(data)


class LocalSandbox:
    """``with LocalSandbox() as sb: sb.run(["bash", "x.sh"])``; the directory is removed on exit."""

    def __init__(self, limits: SandboxLimits | None = None, *, prefix: str = "og-sandbox-") -> None:
        self.limits = limits or SandboxLimits()
        self.limits.validate()
        self._prefix = prefix
        self._root: Path | None = None

    @property
    def root(self) -> Path:
        if self._root is None:
            raise SandboxError("the sandbox is not open")
        return self._root

    def open(self) -> LocalSandbox:
        try:
            self._root = Path(tempfile.mkdtemp(prefix=self._prefix))
            for d in ("home", "tmp"):
                (self._root / d).mkdir()
        except OSError as exc:
            self.close()  # a half-made directory is not left behind
            raise SandboxError(f"sandbox unavailable: {exc}") from exc
        return self

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> LocalSandbox:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def copy_in(self, src: Path, dest: str) -> Path:
        """Copy a file or a directory tree into the sandbox at the relative path ``dest``.

        Sockets, FIFOs and devices in a tree are left out: they cannot be copied, and a workspace may well hold
        a dead server's socket. A copy that fails is the sandbox's failure (``SandboxError``)."""
        target = self.root / dest
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            if Path(src).is_dir():
                shutil.copytree(src, target, symlinks=True, dirs_exist_ok=True, ignore=_special_files)
            else:
                shutil.copy2(src, target)
        except OSError as exc:  # shutil.Error too
            raise SandboxError(f"sandbox failed to copy {src} in: {exc}") from exc
        return target

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        host = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d not in _SYSTEM_PATH]
        env["PATH"] = os.pathsep.join([*_SYSTEM_PATH, *host])
        env.update(HOME=str(self.root / "home"), TMPDIR=str(self.root / "tmp"), SANDBOX_ROOT=str(self.root))
        env.update(extra or {})
        return env

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | Path | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult:
        lim = limits or self.limits
        lim.validate()
        if lim.group_memory_mb is not None and not os.path.isdir("/proc"):
            raise SandboxError("sandbox unavailable: group_memory_mb needs /proc to watch the command's memory")
        isolation = [] if lim.network else no_network_prefix()
        prefix = _limit_prefix(lim) + isolation
        workdir = self.root / cwd if cwd is not None and not Path(cwd).is_absolute() else Path(cwd or self.root)
        run_env = self.env(env)
        # Resolve the program here: behind ``unshare`` a missing one would look like the command's own failure.
        exe = shutil.which(argv[0], path=run_env["PATH"]) if argv else None
        if exe is None:
            raise SandboxError(f"sandbox failed to start {argv[0] if argv else '(empty argv)'!r}: not found")
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", _REAPER, *prefix, exe, *argv[1:]],
                cwd=workdir,
                env=run_env,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own session: what the command's processes hold is counted by it
            )
        except OSError as exc:
            raise SandboxError(f"sandbox failed to start {argv[0]!r}: {exc}") from exc
        try:
            out, err, timed_out, exceeded = _collect(proc, stdin, lim)
        finally:
            if proc.poll() is None:  # _collect was interrupted
                _end(proc)
        code = 124 if timed_out else 137 if exceeded else _exit_code(proc.returncode)
        return SandboxResult(
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            network_isolated=bool(isolation),
            memory_exceeded=exceeded,
            signal=-proc.returncode if proc.returncode < 0 and not (timed_out or exceeded) else None,
        )


def _special_files(folder: str, names: list[str]) -> set[str]:
    """``copytree``'s ignore: what is neither a file, a directory nor a symlink."""
    out = set()
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                out.add(name)
    return out


def _end(proc: subprocess.Popen[bytes]) -> None:
    """Ask the launcher to kill the command and everything it started (SIGTERM), and wait for it; a launcher
    that does not end within the grace is killed with its session's process groups as a last resort."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(_LAUNCHER_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
