"""The Docker backend (``docker``): each command in a fresh container of a local image, with no network at all.

Every ``run`` is one ``docker run`` (the CLI: the daemon's own client attaches the output and stdin) of a
container with ``--network none`` (its own loopback only; Docker's bridge network is never used), an unprivileged
``--user``, a read-only root with a sized tmpfs ``/tmp``, every capability dropped and ``no-new-privileges``,
docker's init as PID 1 (so everything the command left running dies with the container), the limits as cgroup
limits and rlimits (``--memory``, ``--pids-limit``, ``--cpus``, ``--ulimit``), and the sandbox's private root
(at its own path, as under the namespace backend) and mounts (at their targets) as bind mounts. Allowed loopback
endpoints reach the command through the namespace backend's Unix-socket bridge: the socket directory is
bind-mounted and the image's ``python3`` runs the same forwarder (``_inside.py``) in front of the command.

A timeout ``docker kill``s the container (exit 124); a container the kernel OOM-killed inside its ``--memory``
(``group_memory_mb``) is ``memory_exceeded`` (exit 137). The container is removed after every run (beside the
next one; ``close`` waits for the removals).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._backend import Backend, register_backend
from ._base import SYSTEM_PATH, BaseSandbox, Mount, SandboxError, Wrapped
from ._cgroup import PidsCgroup
from ._egress import EgressRelay
from ._limits import SandboxLimits, SandboxResult
from ._namespace import perl_shim
from ._status import StatusChannel

__all__ = ["BASE_IMAGE", "IMAGE_ENV", "DockerSandbox", "check_docker", "docker_executable", "docker_unavailable"]

BASE_IMAGE = "opengyre-base:bookworm"  # built by scripts/sandbox_image.sh (debootstrap + docker import)
IMAGE_ENV = "OPENGYRE_SANDBOX_IMAGE"  # the image a ``docker`` sandbox gets through the registry
LABEL = "opengyre.sandbox"  # on every container this module starts, so a crashed run's leftovers can be found
OWNER_LABEL = "opengyre.sandbox.owner"  # host:pid of the process that started it
_NOBODY = "65534:65534"
_INSIDE = str(Path(__file__).with_name("_inside.py"))
_EGRESS_DIR = "/run/opengyre-egress"
_LAUNCHER = "/run/opengyre-inside.py"
_STATUS = "/run/opengyre-status"
_RESERVED = ("/proc", "/dev", "/sys", "/tmp", "/run/opengyre-egress", _LAUNCHER, _STATUS)
_CLI_TIMEOUT_S = 60.0  # for a docker kill, inspect or rm to answer
_KILL_RETRY_S = 0.5
# The container ends itself this long after the sandbox's own timeout, should the caller die before killing it
# (a container, unlike the namespace sandbox, does not die with its parent).
_BACKSTOP_GRACE_S = 10


def docker_executable() -> str:
    exe = shutil.which("docker")
    if exe is None:
        raise SandboxError("docker sandbox unavailable: no docker CLI on PATH (apt-get install docker.io)")
    return exe


def docker_unavailable(image: str = BASE_IMAGE) -> str | None:
    """Why the Docker backend cannot run here (no CLI, no daemon answering, ``image`` not built), or None."""
    exe = shutil.which("docker")
    if exe is None:
        return "no docker CLI on PATH (apt-get install docker.io)"
    try:
        version = subprocess.run(
            [exe, "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True, timeout=20, check=False
        )
        if version.returncode != 0:
            last = version.stderr.strip().splitlines()[-1:] or ["no answer"]
            return f"no Docker daemon answers ({last[0]})"
        probe = subprocess.run([exe, "image", "inspect", image], capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"the docker CLI failed: {exc}"
    if probe.returncode != 0:
        return f"image {image} is not built (make sandbox-image)"
    return None


def _own_user() -> str:
    """The caller's uid:gid where it is not root (the mounts are its own files), else nobody's."""
    return _NOBODY if os.getuid() == 0 else f"{os.getuid()}:{os.getgid()}"


def _hand_over(top: Path, uid: int, gid: int) -> None:
    """Give a root caller's writable tree to the container's unprivileged user, who must write there."""
    os.lchown(top, uid, gid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            with contextlib.suppress(FileNotFoundError):
                os.lchown(os.path.join(dirpath, name), uid, gid)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep_leftovers(docker: Sequence[str]) -> int:
    """Remove the exited containers of sandbox callers of this host that died before removing them (a
    container outlives its caller; the backstop ends its command, this its record). Returns how many."""
    listing = subprocess.run(
        [*docker, "ps", "-a", "--filter", f"label={LABEL}", "--filter", "status=exited", "--filter", "status=created",
         "--format", f'{{{{.ID}}}} {{{{.Label "{OWNER_LABEL}"}}}}'],
        capture_output=True, text=True, timeout=_CLI_TIMEOUT_S, check=False,
    )  # fmt: skip
    host = socket.gethostname()
    dead = []
    for line in listing.stdout.splitlines():
        cid, _, owner = line.partition(" ")
        owner_host, _, pid = owner.rpartition(":")
        if owner_host == host and pid.isdigit() and not _alive(int(pid)):
            dead.append(cid)
    if dead:
        subprocess.run([*docker, "rm", "-f", *dead], capture_output=True, timeout=_CLI_TIMEOUT_S, check=False)
    return len(dead)


def _not_started(stderr: str, program: str) -> bool:
    """Whether the launcher said it could not exec ``program`` (then the command never ran: the sandbox's failure
    to report, not an exit code of the command's own)."""
    lines = stderr.strip().splitlines()
    last = lines[-1] if lines else ""
    return last.startswith(f"sandbox: cannot start {program}:") or last.startswith(f"/usr/bin/env: '{program}': ")


class DockerSandbox(BaseSandbox):
    """``with DockerSandbox(limits, image=tag, mounts=[Mount(ws, "/app", True)]) as sb: sb.run(["bash", "x.sh"],
    cwd="/app")``.

    ``image``: a local image (default ``$OPENGYRE_SANDBOX_IMAGE``, else ``opengyre-base:bookworm``); it must
    have /bin/sh, /usr/bin/perl and /usr/bin/timeout (any Debian), and python3 for egress. ``user``: the
    ``uid:gid`` commands run as inside, never root; default the caller's own, or nobody's (65534) for a root
    caller, whose writable directories (the sandbox's root, writable mounts) are chowned to it before each command.
    ``cpus``: the container's CPU quota (``--cpus``), None for none. ``labels``: added to each container's.
    """

    name = "docker"

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        prefix: str = "og-sandbox-",
        mounts: Sequence[Mount] = (),
        egress: Sequence[str] = (),
        image: str | None = None,
        user: str | None = None,
        cpus: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(limits, prefix=prefix, mounts=mounts, egress=egress)
        self.image = image or os.environ.get(IMAGE_ENV) or BASE_IMAGE
        self.user = user or _own_user()
        uid, sep, gid = self.user.partition(":")
        if not (sep and uid.isdigit() and gid.isdigit()):
            raise ValueError(f"user must be a numeric uid:gid, got {self.user!r}")
        if int(uid) == 0 or int(gid) == 0:
            raise ValueError("the docker sandbox never runs commands as root (uid or gid 0)")
        if cpus is not None and not cpus > 0:
            raise ValueError("cpus must be > 0")
        for m in self.mounts:
            if any(m.target == r or m.target.startswith(r + "/") for r in _RESERVED):
                raise ValueError(f"mount target {m.target!r} is one of the container's own places")
            if "," in str(m.source) or "," in m.target:
                raise ValueError(f"a mount path holds a comma, which docker's --mount cannot take: {m}")
        self.cpus = cpus
        self.labels = dict(labels or {})
        self._uid, self._gid = int(uid), int(gid)
        self._relay: EgressRelay | None = None
        self._removals: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._current = threading.local()  # the container of the run in progress in this thread

    # -- life cycle -------------------------------------------------------------------------------------------

    def _setup(self) -> None:
        why = docker_unavailable(self.image)
        if why is not None:
            raise SandboxError(f"docker sandbox unavailable: {why}")
        sweep_leftovers(self._docker())
        assert self._base is not None
        (self._base / "status").mkdir()
        if self.egress:
            sockets = self._base / "egress"
            sockets.mkdir(mode=0o755)
            self._relay = EgressRelay(self.limits.max_egress_connections)
            for host, port in self.egress:
                path = sockets / f"{port}.sock"
                self._relay.serve(path, (host, port))
                path.chmod(0o666)  # connecting takes write permission, and the container's user is not ours

    def _teardown(self) -> None:
        with self._lock:
            removals, self._removals = self._removals, []
        for t in removals:
            t.join(_CLI_TIMEOUT_S)
        if self._relay is not None:
            self._relay.close()
            self._relay = None

    # -- paths and environment ----------------------------------------------------------------------------------

    def _host_of(self, inside_path: str) -> Path | None:
        return None  # the image's files are not the host's

    def _cwd(self, cwd: str | Path | None) -> str:
        try:
            return super()._cwd(cwd)
        except SandboxError:
            if cwd is not None and str(cwd).startswith("/"):
                return os.path.normpath(cwd)  # a directory of the image's own (a task's WORKDIR)
            raise

    def _path_dirs(self) -> list[str]:
        return list(SYSTEM_PATH)  # the image's standard PATH; the host's directories do not exist there

    # -- running ----------------------------------------------------------------------------------------------

    def _check(self, limits: SandboxLimits) -> None:
        if limits.memory_group is not None:  # its memory cgroup is the daemon's: no nesting in one of ours
            raise SandboxError(
                f"the docker sandbox cannot share a memory budget (memory_group {limits.memory_group!r}): each "
                "container has its own --memory; turn the shared budget off (the run config's group_memory_mb = 0)"
            )
        if limits.network:
            raise SandboxError(
                "the docker sandbox gives no network (--network none): give it egress endpoints (loopback "
                "host:port) instead"
            )

    def _network_isolated(self, limits: SandboxLimits) -> bool:
        return True

    def _resolve(self, name: str, path: str, cwd: str) -> str | None:
        return name  # found in the image by the launcher; a missing one is reported from its message

    def _cgroup(self, limits: SandboxLimits) -> PidsCgroup | None:
        return None  # the container's own pids cgroup (--pids-limit)

    def _processes(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> int:
        return 0  # group_memory_mb is the container's memory cgroup (--memory): the kernel enforces it

    def _docker(self) -> list[str]:
        host = os.environ.get("DOCKER_HOST")  # the CLI runs with the command's environment, not ours
        return [docker_executable(), *(["--host", host] if host else [])]

    def _wrap(
        self, command: list[str], limits: SandboxLimits, cwd: str, cgroup: PidsCgroup | None, env: dict[str, str]
    ) -> Wrapped:
        assert self._base is not None
        name = self._current.name
        root_caller = os.getuid() == 0
        if root_caller:
            for top in [self.root, *(m.source for m in self.mounts if m.writable)]:
                _hand_over(top, self._uid, self._gid)
        # The status comes over a socket accepted once, from the launcher (``_status.py``): never a file, which
        # the command's user could write before killing the launcher.
        channel = StatusChannel(self._base / "status" / f"{name}.sock", (self._uid, self._gid) if root_caller else None)
        self._current.channel = channel
        status = channel.path
        root = str(self.root)
        # Neither a command nor the user may be an option to docker, and docker's init (tini) must be PID 1.
        argv = [
            *self._docker(), "run", "--name", name, "--label", f"{LABEL}=1", "--label", f"{OWNER_LABEL}={_owner()}",
            "--init", "--network", "none",
            "--user", self.user, "--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
            "--log-driver", "none", "--pull", "never", "--workdir", cwd, "--ulimit", "core=0",
            "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777" + ("" if limits.disk_mb is None else
                                                           f",size={min(limits.disk_mb, 1024)}m"),
            "--mount", f"type=bind,source={root},target={root}",
            "--mount", f"type=bind,source={status},target={_STATUS}",
        ]  # fmt: skip
        for k, v in self.labels.items():
            argv += ["--label", f"{k}={v}"]
        argv.append("--interactive")  # stdin: the sandbox's (a pipe, or /dev/null: the command sees an end)
        if limits.max_processes is not None:  # a pids cgroup: the container's own processes and threads
            argv += ["--pids-limit", str(limits.max_processes)]
        if limits.group_memory_mb is not None:  # the container's memory cgroup: all its processes, no swap
            argv += ["--memory", f"{limits.group_memory_mb}m", "--memory-swap", f"{limits.group_memory_mb}m"]
        if limits.cpu_s is not None:
            argv += ["--ulimit", f"cpu={limits.cpu_s}"]
        if limits.disk_mb is not None:
            argv += ["--ulimit", f"fsize={limits.disk_mb * 1024 * 1024}"]
        if self.cpus is not None:
            argv += ["--cpus", str(self.cpus)]
        for m in self.mounts:
            src = str(m.source.resolve())
            argv += ["--mount", f"type=bind,source={src},target={m.target}" + ("" if m.writable else ",readonly")]
        if self.egress:
            argv += ["--mount", f"type=bind,source={self._base / 'egress'},target={_EGRESS_DIR},readonly"]
            argv += ["--mount", f"type=bind,source={_INSIDE},target={_LAUNCHER},readonly"]
        for k, v in env.items():
            argv += ["--env", f"{k}={v}"]
        argv.append(self.image)
        # Docker has no RLIMIT_AS ulimit: the image's shell sets it. The launcher reports the command's raw wait
        # status on the status socket (docker's init folds a signal into 128 + n).
        script = "" if limits.memory_mb is None else f"ulimit -v {limits.memory_mb * 1024}; "
        script += 'exec "$@"'
        backstop = math.ceil(limits.timeout_s) + _BACKSTOP_GRACE_S
        argv += ["/bin/sh", "-c", script, "sandbox", "/usr/bin/timeout", "--signal", "KILL", str(backstop)]
        if self.egress:
            specs = [f"{h}:{p}={_EGRESS_DIR}/{p}.sock" for h, p in self.egress]
            # The forwarder spawns an absolute path: env finds the program on PATH and execs it in its place.
            argv += ["python3", "-I", "-S", _LAUNCHER, f"unix:{_STATUS}", *specs, "--", "/usr/bin/env", "--"]
        else:
            shim = perl_shim(status_socket=True)
            if shim is None:
                raise SandboxError(f"docker sandbox unavailable: no status shim for {platform.machine()}")
            argv += ["/usr/bin/perl", "-e", shim, _STATUS]
        argv += command
        return Wrapped(argv, self.root, status_reader=channel.status)

    def _end(self, proc: subprocess.Popen[bytes], cgroup: PidsCgroup | None) -> None:
        # Killing the container kills its init and with it every process of its pid namespace; the CLI then ends.
        # A container still being created when the time runs out is not there to kill yet: kill again until the
        # CLI ends (the caller's rm -f then takes what is left).
        deadline = time.monotonic() + _CLI_TIMEOUT_S
        while True:
            subprocess.run(
                [*self._docker(), "kill", self._current.name], capture_output=True, timeout=_CLI_TIMEOUT_S, check=False
            )
            try:
                proc.wait(_KILL_RETRY_S)
                return
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    proc.kill()
                    proc.wait()
                    return

    def _remove_later(self, name: str) -> None:
        """``docker rm -f`` the run's container beside the next run (it takes 0.05-0.3 s of the daemon's time on
        a busy machine); ``close`` waits for every removal, and a caller that dies first leaves it to the sweep."""

        def remove() -> None:
            subprocess.run(
                [*self._docker(), "rm", "-f", name], capture_output=True, timeout=_CLI_TIMEOUT_S, check=False
            )

        t = threading.Thread(target=remove, name=f"docker-rm-{name}", daemon=True)
        t.start()
        with self._lock:
            self._removals = [r for r in self._removals if r.is_alive()]
            self._removals.append(t)

    def _state(self, name: str) -> dict[str, object] | None:
        probe = subprocess.run(
            [*self._docker(), "inspect", "-f", "{{json .State}}", name],
            capture_output=True,
            timeout=_CLI_TIMEOUT_S,
            check=False,
        )
        return json.loads(probe.stdout) if probe.returncode == 0 else None  # type: ignore[no-any-return]

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
        name = f"og-sb-{os.urandom(8).hex()}"
        self._current.name = name
        self._current.channel = None
        try:
            result = super()._run(exe, args, lim, workdir, run_env, stdin, cgroup)
            state = self._state(name) if result.exit_code in (125, 137) and not result.timed_out else None
        finally:
            self._remove_later(name)
            if self._current.channel is not None:
                self._current.channel.close()
        if result.exit_code == 125 and (state is None or not str(state.get("StartedAt", "")).startswith("2")):
            raise SandboxError(f"docker sandbox could not start a container: {result.stderr.strip()[-2000:]}")
        if result.exit_code == 127 and _not_started(result.stderr, exe):
            raise SandboxError(f"sandbox failed to start {exe!r}: not found in {self.image}")
        if state is not None and state.get("OOMKilled") and result.exit_code == 137:
            result = dataclasses.replace(result, memory_exceeded=True, signal=None)
        return result


def check_docker() -> tuple[bool, list[str]]:
    """``opengyre sandbox check``'s lines for the Docker backend (real container runs, not a guess)."""
    from ._check import _echo_server

    image = os.environ.get(IMAGE_ENV) or BASE_IMAGE
    why = docker_unavailable(image)
    if why is not None:
        return False, [f"unavailable: {why}"]
    probe = "id -u; ls /sys/class/net | tr '\\n' ,; echo; grep CapEff /proc/self/status | cut -f2"
    server, port = _echo_server()
    call = f"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.sendall(b'ping'); "
    call += "print(s.recv(64).decode())"
    try:
        with DockerSandbox(SandboxLimits(timeout_s=60), image=image, egress=[f"127.0.0.1:{port}"]) as sb:
            r = sb.run(["sh", "-c", probe])
            bridge = sb.run(["python3", "-I", "-S", "-c", call])
    except SandboxError as exc:
        return False, [f"unavailable: {exc}"]
    finally:
        server.close()
    if not r.ok:
        return False, [f"a probe container failed: {r.stderr.strip()[-300:]}"]
    uid, nets, caps = r.stdout.split()
    works = bridge.ok and bridge.stdout.strip() == "PING"
    return True, [
        f"image {image}; a fresh container per command (docker run --network none --read-only --init)",
        f"uid inside: {uid}; capabilities: {int(caps, 16)}; interfaces: {nets.rstrip(',')} (loopback only)",
        "limits: --memory (group_memory_mb), --pids-limit, --cpus, ulimits; disk: RLIMIT_FSIZE + the watcher",
        "egress bridge: " + ("works" if works else f"FAILED ({bridge.stderr.strip()[-200:]})"),
    ]


register_backend(Backend("docker", DockerSandbox, check_docker))
