"""What every backend shares: the sandbox's private directory, its mounts, the environment, starting a command
under its limits and watching it (time, the group's memory, the disk) until it ends.

A backend says how a command is wrapped (``_wrap``), how paths the caller knows on the host are seen by the
command (``inside``), how the command's processes are found and killed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from ._cgroup import PidsCgroup, memory_cgroup_parent, pids_cgroup_parent
from ._egress import parse_endpoint
from ._limits import SandboxLimits, SandboxResult

__all__ = ["BaseSandbox", "Mount", "SandboxError", "Wrapped"]

log = logging.getLogger("opengyre.sandbox")

_BASE_ENV = ("LANG", "LC_ALL", "TZ")
# A container's standard PATH (Debian's, which the Docker images we build on keep). The sandbox stands in for
# such a substrate, so its programs come first; the host's own PATH follows, so nothing it finds goes missing.
# Without this a host's version-manager shims shadow the system's programs: a pyenv ``python3`` is a bash
# script that runs ~40 processes before the interpreter (~0.1 CPU-s for each grader or solution started).
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
_LAUNCHER_GRACE_S = 10.0  # for the launcher to kill and reap the command's tree once asked to
_PIPE_GRACE_S = 5.0  # for the output readers to reach the end of pipes the command's tree no longer holds


class SandboxError(RuntimeError):
    """The sandbox itself could not be set up or could not start the command (an infrastructure failure)."""


@dataclass(frozen=True)
class Mount:
    """A host directory (or file) the command sees at ``target`` (absolute), read-only unless ``writable``.
    Writable mounts count towards the disk quota. Under the process backend (``none``) the command sees the host
    as it is, so ``target`` is the source's own path there (``Sandbox.inside`` translates either way)."""

    source: Path
    target: str
    writable: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "source", Path(self.source))
        t = self.target
        if not t.startswith("/") or posixpath.normpath(t) != t or t == "/" or "//" in t:
            raise ValueError(f"mount target {t!r} must be a normalised absolute path other than /")


@dataclass
class Wrapped:
    """How a backend starts one command: the argv, the host cwd, the fds it inherits, the status pipe's read end
    (the launcher writes the command's raw wait status there; None: the exit code alone says it), or instead
    ``status_reader``, called once the launcher has ended, which returns the status its own channel brought."""

    argv: list[str]
    cwd: Path
    pass_fds: tuple[int, ...] = ()
    status_read: int | None = None
    close_after_start: list[int] = field(default_factory=list)
    status_reader: Callable[[], int | None] | None = None

    @property
    def reports_status(self) -> bool:
        return self.status_read is not None or self.status_reader is not None


def limit_prefix(limits: SandboxLimits, *, nproc: bool) -> list[str]:
    """argv prefix applying the resource limits (``nproc``: RLIMIT_NPROC too).

    ``prlimit`` (util-linux) or a shell's ``ulimit`` set them in the child before it execs the command.
    A ``preexec_fn`` would run Python between fork and exec, which can deadlock or crash in a process with
    threads (a gRPC server, the engine); these prefixes keep the child free of Python.
    """
    caps: list[tuple[str, int, str]] = [("--core", 0, "ulimit -c 0")]
    if limits.memory_mb is not None:  # ulimit -v counts KiB
        caps.append(("--as", limits.memory_mb * 1024 * 1024, f"ulimit -v {limits.memory_mb * 1024}"))
    if limits.cpu_s is not None:
        caps.append(("--cpu", limits.cpu_s, f"ulimit -t {limits.cpu_s}"))
    if limits.disk_mb is not None:  # /bin/sh's ulimit -f counts 512-byte blocks (POSIX)
        caps.append(("--fsize", limits.disk_mb * 1024 * 1024, f"ulimit -f {limits.disk_mb * 2048}"))
    if nproc and limits.max_processes is not None:
        # The process limit is ``-u`` in bash and ``-p`` in dash (a Debian /bin/sh), where ``-u`` is an error.
        n = limits.max_processes
        caps.append(("--nproc", n, f"ulimit -u {n} 2>/dev/null || ulimit -p {n}"))
    prlimit = shutil.which("prlimit", path=os.pathsep.join(SYSTEM_PATH)) if limits.limiter != "ulimit" else None
    if prlimit is None and limits.limiter == "prlimit":
        prlimit = shutil.which("prlimit")
        if prlimit is None:
            raise SandboxError("sandbox unavailable: prlimit is not installed")
    if prlimit is not None:
        return [prlimit, *(f"{flag}={value}" for flag, value, _ in caps), "--"]
    script = "; ".join(command for _, _, command in caps)
    return ["/bin/sh", "-c", script + '; exec "$@"', "sandbox"]


def oom_kill_count() -> int | None:
    """The kernel's count of OOM kills since boot, on the whole machine (memory cgroups' included), or None."""
    try:
        with open("/proc/vmstat", "rb") as f:
            for line in f:
                if line.startswith(b"oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def _exit_code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _stat_fields(pid: str) -> list[bytes] | None:
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None  # gone meanwhile
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # After "pid (comm) ": state ppid pgrp session ... rss is field 24 (index 21 from state).
    return data[data.rfind(b")") + 2 :].split(maxsplit=22)


def rss_of(pids: Sequence[int]) -> int:
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        fields = _stat_fields(str(pid))
        if fields is not None and len(fields) > 21:
            total += int(fields[21]) * page
    return total


def session_rss(session: int) -> int:
    """Resident bytes of every process in ``session`` (the command's: it runs in a session of its own), but
    the session's leader, the sandbox's launcher.

    Every process on the machine is looked at (a process the command orphaned keeps its session but leaves the
    command's tree), several times a second while a command runs: raw ``os.open``/``os.read`` instead of a
    buffered file object halves what a poll costs (~0.7 ms instead of ~1.4 ms with ~170 processes)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == session:
            continue
        fields = _stat_fields(name)
        if fields is not None and len(fields) > 21 and int(fields[3]) == session:
            total += int(fields[21]) * page
    return total


def descendants(root: int) -> list[int]:
    """``root``'s descendants (from /proc). In a pid namespace an orphan is reparented to the namespace's init,
    itself a descendant, so this is every process of a namespace sandbox."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(name)
        if fields is not None and len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(name))
    out, todo = [], [root]
    while todo:
        for kid in children.get(todo.pop(), ()):
            out.append(kid)
            todo.append(kid)
    return out


# What one inode costs the quota at least: an empty file or a short symlink allocates no block, yet takes an
# inode of the host's file system (the data dir's) and a turn of every poll; uncounted, a command could make
# millions of them within any quota.
INODE_BYTES = 4096


def allocated_bytes(paths: Sequence[Path]) -> int:
    """Bytes allocated on disk under ``paths`` (st_blocks, each inode once and at least ``INODE_BYTES``;
    symlinks not followed).

    A directory its owner cannot read or enter (the command's ``chmod 300`` or ``000`` after writing there)
    hides its files from a caller without root's DAC override, which is how the stack of an ordinary user runs:
    the sandbox's user is mapped onto the caller's, so the command owns it. Such a directory of ours is opened
    up (owner read and search added) for the walk and given its mode back after it, its inode pinned
    (``O_PATH | O_NOFOLLOW``: a symlink swapped in meanwhile changes nothing elsewhere). Past ``_MAX_OPENED``
    of them in one walk the quota cannot be checked: the count is past any quota."""
    seen: set[tuple[int, int]] = set()
    opened: list[tuple[int, int]] = []  # (pinned descriptor, mode to give back)
    total = 0
    todo = [str(p) for p in paths]
    try:
        while todo:
            top = todo.pop()
            listing = _listing(top, opened)
            if listing is None:
                return sys.maxsize
            for path, st in listing:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += max(st.st_blocks * 512, INODE_BYTES)
                if stat.S_ISDIR(st.st_mode):
                    todo.append(path)
    finally:
        for pinned, mode in reversed(opened):
            with contextlib.suppress(OSError):
                os.chmod(f"/proc/self/fd/{pinned}", mode)
            os.close(pinned)
    return total


_MAX_OPENED = 64  # directories opened up in one walk (each holds a descriptor until the walk ends)


def _listing(top: str, opened: list[tuple[int, int]]) -> list[tuple[str, os.stat_result]] | None:
    """``top``'s entries with their ``lstat`` (those gone meanwhile left out); a directory of ours that cannot be
    read is opened up first (``opened`` says how to give it back); None past ``_MAX_OPENED`` of them."""
    out: list[tuple[str, os.stat_result]] = []
    for attempt in (0, 1):
        try:
            with os.scandir(top) as it:
                for e in it:
                    with contextlib.suppress(OSError):  # gone meanwhile: the others still count
                        out.append((e.path, e.stat(follow_symlinks=False)))
            return out
        except PermissionError:
            if attempt or not _open_up(top, opened):
                return None if len(opened) >= _MAX_OPENED else out
        except OSError:
            return out
    return out


def _open_up(top: str, opened: list[tuple[int, int]]) -> bool:
    if len(opened) >= _MAX_OPENED:
        return False
    try:
        pinned = os.open(top, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False  # its parent cannot be entered either, or it is no directory of ours any more
    try:
        st = os.fstat(pinned)
        if st.st_uid == os.geteuid():
            mode = stat.S_IMODE(st.st_mode)
            os.chmod(f"/proc/self/fd/{pinned}", mode | stat.S_IRUSR | stat.S_IXUSR)
            opened.append((pinned, mode))
            return True
    except OSError:
        pass
    os.close(pinned)
    return False


def remove_tree(top: Path) -> None:
    """Remove a sandbox's directory, whatever modes its command left there (best effort, never raising). The
    command owns what it made (its user is mapped onto ours) and may ``chmod 000`` a directory of it: without
    root's DAC override ``rmtree`` could not enter or empty it and left it behind, up to the disk quota's bytes
    per sandbox, on the host's disk for good. Such a directory, or its parent, of ours is given its owner's
    access back and removed. Called once the command's processes are gone: nothing swaps a path meanwhile."""

    def opened_up(func: Callable[..., object], path: str, exc_info: tuple[type, BaseException, object]) -> None:
        if not isinstance(exc_info[1], PermissionError):
            return  # gone already, or not ours to fix
        with contextlib.suppress(OSError):
            for d in (os.path.dirname(path), path):
                st = os.lstat(d)
                if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                    os.chmod(d, stat.S_IMODE(st.st_mode) | stat.S_IRWXU)
            if stat.S_ISDIR(os.lstat(path).st_mode):
                shutil.rmtree(path, onerror=opened_up)
            else:
                os.unlink(path)

    with contextlib.suppress(OSError):
        shutil.rmtree(top, onerror=opened_up)


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


def _special_files(folder: str, names: list[str]) -> set[str]:
    """``copytree``'s ignore: what is neither a file, a directory nor a symlink."""
    out = set()
    for name in names:
        with contextlib.suppress(OSError):
            mode = os.lstat(os.path.join(folder, name)).st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode)):
                out.add(name)
    return out


class BaseSandbox:
    """``with sandbox as sb: sb.run(["bash", "x.sh"])``; the private directory is removed on exit.

    ``sb.root`` is the sandbox's private host directory (``home/`` and ``tmp/`` inside it); the command sees it
    at the same path. ``mounts`` are what else it sees of the host."""

    name = ""  # the backend's name, as selected

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        prefix: str = "og-sandbox-",
        mounts: Sequence[Mount] = (),
        egress: Sequence[str] = (),
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.limits.validate()
        self.mounts = tuple(mounts)
        targets = [m.target for m in self.mounts]
        if len(set(targets)) != len(targets):
            raise ValueError(f"two mounts share a target: {targets}")
        self.egress = tuple(parse_endpoint(e) for e in egress)
        self._prefix = prefix
        self._base: Path | None = None
        self._root: Path | None = None

    # -- life cycle -------------------------------------------------------------------------------------------

    @property
    def root(self) -> Path:
        if self._root is None:
            raise SandboxError("the sandbox is not open")
        return self._root

    @property
    def isolation(self) -> str:
        """What ``SandboxResult.isolation`` will say for this sandbox's commands."""
        return self.name

    def open(self) -> BaseSandbox:
        if self._root is not None:
            return self
        for m in self.mounts:
            if not m.source.exists():
                raise SandboxError(f"sandbox unavailable: the mount source {m.source} does not exist")
        try:
            # The private directory is the base's ``root``; the base also holds what the command must not see
            # whole (the egress sockets, generated /etc files).
            self._base = Path(tempfile.mkdtemp(prefix=self._prefix))
            self._root = self._base / "root"
            for d in ("home", "tmp"):
                (self._root / d).mkdir(parents=True)
            self._setup()
        except OSError as exc:
            self.close()  # a half-made directory is not left behind
            raise SandboxError(f"sandbox unavailable: {exc}") from exc
        except BaseException:
            self.close()
            raise
        return self

    def _setup(self) -> None:
        """A backend's own preparation once the directories exist."""

    def _teardown(self) -> None:
        """A backend's own cleanup before the directories go."""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._teardown()
        if self._base is not None:
            remove_tree(self._base)
        self._base = self._root = None

    def __enter__(self) -> BaseSandbox:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- paths ------------------------------------------------------------------------------------------------

    def _seen(self, m: Mount) -> str:
        """Where the command sees mount ``m``: its target (the process backend: its source, the host as it is)."""
        return m.target

    def inside(self, host_path: str | Path) -> str:
        """Where the command sees ``host_path`` (under the sandbox's root or one of its mounts)."""
        p = Path(os.path.abspath(host_path))
        root = self.root
        if p == root or root in p.parents:
            return str(p)
        best: Mount | None = None
        for m in self.mounts:
            src = Path(os.path.abspath(m.source))
            if (p == src or src in p.parents) and (best is None or len(str(src)) > len(str(best.source))):
                best = Mount(src, m.target, m.writable)
        if best is None:
            raise SandboxError(f"{host_path} is neither under the sandbox's root nor under one of its mounts")
        rel = p.relative_to(best.source)
        seen = self._seen(best)
        return seen if str(rel) == "." else posixpath.join(seen, str(rel))

    def _host_of(self, inside_path: str) -> Path | None:
        """The host path behind ``inside_path``, None where the command cannot see it (what the backend binds)."""
        return Path(inside_path)

    def _writable(self) -> list[Path]:
        return [self.root, *(m.source for m in self.mounts if m.writable and m.source.is_dir())]

    def _cwd(self, cwd: str | Path | None) -> str:
        if cwd is None:
            return str(self.root)
        c = str(cwd)
        if not c.startswith("/"):
            return posixpath.normpath(posixpath.join(str(self.root), c))
        with contextlib.suppress(SandboxError):
            return self.inside(c)
        c = posixpath.normpath(c)
        for m in self.mounts:  # a mount's target: where the command sees it
            if c == m.target or c.startswith(m.target + "/"):
                return posixpath.normpath(posixpath.join(self._seen(m), posixpath.relpath(c, m.target)))
        raise SandboxError(f"the working directory {c} is neither under the sandbox's root nor under a mount")

    # -- environment ------------------------------------------------------------------------------------------

    def _home(self) -> str:
        return str(self.root / "home")

    def _path_dirs(self) -> list[str]:
        host = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d not in SYSTEM_PATH]
        return [*SYSTEM_PATH, *host]

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        env["PATH"] = os.pathsep.join(self._path_dirs())
        env.update(HOME=self._home(), TMPDIR=str(self.root / "tmp"), SANDBOX_ROOT=str(self.root))
        env.update(self._marker())
        env.update(extra or {})
        return env

    def _marker(self) -> dict[str, str]:
        return {}

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

    # -- running ----------------------------------------------------------------------------------------------

    def _check(self, limits: SandboxLimits) -> None:
        """Refuse limits this backend cannot honour."""

    def _resolve(self, name: str, path: str, cwd: str) -> str | None:
        """``name`` as the command will exec it (searched on ``path`` as the command sees it), or None."""
        if "/" in name:
            candidates = [name if name.startswith("/") else posixpath.join(cwd, name)]
        else:
            candidates = [posixpath.join(d, name) for d in path.split(os.pathsep) if d.startswith("/")]
        for c in candidates:
            host = self._host_of(c)
            if host is not None and host.is_file() and os.access(host, os.X_OK):
                return c
        return None

    def _wrap(
        self, command: list[str], limits: SandboxLimits, cwd: str, cgroup: PidsCgroup | None, env: dict[str, str]
    ) -> Wrapped:
        raise NotImplementedError

    def _processes(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> int:
        """Resident bytes of the command's processes."""
        raise NotImplementedError

    def _end(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
        """Kill the command's whole tree and reap its launcher."""
        raise NotImplementedError

    def _cgroup(self, limits: SandboxLimits) -> PidsCgroup | None:
        parent = pids_cgroup_parent()
        group = limits.memory_group
        if group is not None and (parent is None or memory_cgroup_parent() is None):
            raise SandboxError(
                f"sandbox unavailable: the memory budget shared by group {group!r} (memory_group, "
                f"group_memory_mb={limits.group_memory_mb}) is a cgroup limit, and this process cannot make "
                f"{'pids' if parent is None else 'memory'} cgroups here (cgroups are not delegated to it: run it "
                "where /sys/fs/cgroup is writable, a delegated systemd scope, or turn the shared budget off, as "
                "the run config's group_memory_mb = 0 does for rollouts)"
            )
        if (limits.max_processes is None and group is None) or parent is None:
            return None
        mb = limits.group_memory_mb
        try:
            cg = PidsCgroup(
                parent, limits.max_processes, memory_cgroup_parent(), None if mb is None else mb << 20, group
            )
            cg.make()
        except OSError as exc:
            raise SandboxError(f"sandbox unavailable: cannot make the command's cgroups under {parent}: {exc}") from exc
        return cg

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
        self._check(lim)
        if (lim.group_memory_mb is not None or lim.disk_mb is not None) and not os.path.isdir("/proc"):
            raise SandboxError("sandbox unavailable: the sandbox's watchers need /proc")
        workdir = self._cwd(cwd)
        run_env = self.env(env)
        # Resolve the program here: inside the sandbox a missing one would look like the command's own failure.
        exe = self._resolve(argv[0], run_env["PATH"], workdir) if argv else None
        if exe is None:
            raise SandboxError(f"sandbox failed to start {argv[0] if argv else '(empty argv)'!r}: not found")
        cgroup = self._cgroup(lim)
        try:
            return self._run(exe, list(argv[1:]), lim, workdir, run_env, stdin, cgroup)
        finally:
            if cgroup is not None:
                cgroup.remove()

    def _run(
        self,
        exe: str,
        args: list[str],
        lim: SandboxLimits,
        workdir: str,
        run_env: dict[str, str],
        stdin: bytes | None,
        cgroup: PidsCgroup | None,
    ) -> SandboxResult:
        wrapped = self._wrap([exe, *args], lim, workdir, cgroup, run_env)
        ooms = oom_kill_count()
        start = time.monotonic()
        try:
            try:
                proc = subprocess.Popen(
                    wrapped.argv,
                    cwd=wrapped.cwd,
                    env=run_env,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=wrapped.pass_fds,
                    start_new_session=True,  # its own session: what the command's processes hold is counted by it
                )
            except OSError as exc:
                raise SandboxError(f"sandbox failed to start {exe!r}: {exc}") from exc
            finally:
                for fd in wrapped.close_after_start:
                    os.close(fd)
            try:
                out, err, reason = self._collect(proc, stdin, lim, cgroup)
            finally:
                if proc.poll() is None:  # _collect was interrupted
                    self._end(proc, cgroup)
            status = wrapped.status_reader() if wrapped.status_reader else _read_status(wrapped.status_read)
        finally:
            if wrapped.status_read is not None:
                os.close(wrapped.status_read)
        # The command's own memory cgroup's count where it has one; else the machine's meanwhile (any process's).
        own = cgroup.oom_kills() if cgroup is not None else None
        after = oom_kill_count()
        oom_kills = own if own is not None else after - ooms if after is not None and ooms is not None else None
        scope = "cgroup" if own is not None else "machine" if oom_kills is not None else ""
        timed_out, mem, disk = reason == "timeout", reason == "memory", reason == "disk"
        if status is not None and not reason:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            code = 128 + sig if sig is not None else os.waitstatus_to_exitcode(status)
        elif wrapped.reports_status and not reason and proc.returncode in (137, -9):
            # The launcher reports before it ends, and only a SIGKILL ends it early (its init then exits 137):
            # killed, by the command's own processes (which share its user) or from outside, so whatever the
            # command left is no command's verdict. Said as a SIGKILL, never as a plain exit code 137.
            sig, code = signal.SIGKILL.value, 137
            err += b"\nsandbox: the launcher was killed before it reported the command's status\n"
        else:
            sig = -proc.returncode if proc.returncode < 0 and not reason else None
            code = _exit_code(proc.returncode)
        if sig == signal.SIGKILL and own and cgroup and (cgroup.memory_max or cgroup.group):
            mem, sig = True, None  # the kernel's limit on its memory cgroup or its group's (group_memory_mb)
        code = 124 if timed_out else 137 if (mem or disk) else code
        if disk:
            err += f"\nsandbox: killed: the writable directories exceeded the disk quota of {lim.disk_mb} MB\n".encode()
        return SandboxResult(
            exit_code=code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=err.decode("utf-8", errors="replace"),
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            network_isolated=self._network_isolated(lim),
            memory_exceeded=mem,
            signal=sig,
            disk_exceeded=disk,
            isolation=self.isolation,
            oom_kills=oom_kills,
            oom_kills_scope=scope,
        )

    def _network_isolated(self, limits: SandboxLimits) -> bool:
        raise NotImplementedError

    def _collect(
        self, proc: subprocess.Popen[bytes], stdin: bytes | None, limits: SandboxLimits, cgroup: PidsCgroup | None
    ) -> tuple[bytes, bytes, str]:
        """``communicate`` (the exit, within the timeout, then both pipes to their end; on timeout the command's
        whole tree is killed), keeping only the first ``max_output_bytes`` of each stream as they come: a command
        that prints without end cannot fill this process's memory. With ``group_memory_mb`` the command's
        processes are watched and killed together past it; with ``disk_mb`` its writable directories.
        Returns (stdout, stderr, why it was killed: "", "timeout", "memory" or "disk")."""
        keep = limits.max_output_bytes
        budget = limits.group_memory_mb * 1024 * 1024 if limits.group_memory_mb is not None else None
        quota = limits.disk_mb * 1024 * 1024 if limits.disk_mb is not None else None
        deadline = time.monotonic() + limits.timeout_s
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
        checks: list[tuple[float, Callable[[], bool], str]] = []
        if budget is not None:
            checks.append((limits.memory_poll_s, lambda: self._processes(proc, cgroup) > budget, "memory"))
        if quota is not None:
            writable = self._writable()
            checks.append((limits.disk_poll_s, lambda: allocated_bytes(writable) > quota, "disk"))
        # A check's next turn: its interval, or 20 times what it took (a workspace of many files), whichever is
        # longer: the watchers take at most ~5% of a CPU whatever the tree.
        spent = [0.0 for _ in checks]
        due = [time.monotonic() + every for every, _, _ in checks]
        reason = ""
        while not reason:
            now = time.monotonic()
            wake = min([deadline, *due])
            try:
                proc.wait(max(wake - now, 0.0))
                break  # the command's end is its launcher's exit, whoever else still holds the pipes open
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if now >= deadline:
                reason = "timeout"
                break
            for i, (every, over, why) in enumerate(checks):
                if now >= due[i]:
                    t0 = time.monotonic()
                    exceeded = over()
                    spent[i] = time.monotonic() - t0
                    due[i] = t0 + max(every, 20 * spent[i])
                    if exceeded:
                        reason = why
                        break
        if not reason and quota is not None and allocated_bytes(writable) > quota:
            # Written past the quota between two polls and ended before the next (a loaded machine's poller is
            # late): what it left counts all the same (a CI run saw 64 MiB under a 16 MiB quota pass).
            reason = "disk"
        if reason:
            self._end(proc, cgroup)
        # Every process of the command is dead, so the pipes are at their end; a reader that is not (a descriptor
        # passed out of the tree) is left behind rather than holding the result.
        for w in workers:
            w.join(_PIPE_GRACE_S)
        return bytes(out), bytes(err), reason


def _read_status(fd: int | None) -> int | None:
    if fd is None:
        return None
    data = b""
    with contextlib.suppress(OSError):
        while chunk := os.read(fd, 64):
            data += chunk
    try:
        return int(data.split()[0]) if data.split() else None
    except ValueError:
        return None


def end_launcher(proc: subprocess.Popen[bytes]) -> None:
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
