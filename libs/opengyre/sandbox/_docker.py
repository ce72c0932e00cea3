"""The Docker sandbox: each command in a fresh container of a local image, with no network at all.

Every ``run`` is one ``docker run`` (the CLI, so the daemon's own client handles attach and stdin) of a
container that has: ``--network none`` (only its own loopback; Docker's bridge network is never used), an
unprivileged ``--user``, a read-only root with a tmpfs ``/tmp``, every capability dropped and
``no-new-privileges``, docker's init as PID 1 (so the command's signals behave as outside, and everything it
left running dies with the container), the limits as cgroup limits (``--memory``, ``--pids-limit``, ``--cpus``)
and rlimits, and the mounts as bind mounts at their fixed inside paths. Allowed loopback endpoints reach the
command through the same Unix-socket bridge as the namespace sandbox: the socket directory is bind-mounted
and the image's ``python3`` runs the forwarder in front of the command.

A timeout ``docker kill``s the container (exit 124); a container the kernel OOM-killed inside its ``--memory``
is ``memory_exceeded`` (exit 137). The container is removed after every run, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from types import TracebackType
from typing import IO

from ._limits import SandboxLimits, SandboxResult
from ._local import SandboxError

__all__ = ["BASE_IMAGE", "DockerSandbox", "Mount", "docker_unavailable"]

BASE_IMAGE = "opengyre-base:bookworm"  # built by scripts/sandbox_image.sh (debootstrap + docker import)
LABEL = "opengyre.sandbox"  # on every container this module starts, so a crashed run's leftovers can be found
_NOBODY = "65534:65534"
_TMPFS = "/tmp:rw,nosuid,nodev,size=256m,mode=1777"
_CLI_GRACE_S = 30.0  # for the CLI to return once its container is killed
_PIPE_GRACE_S = 5.0


@dataclass(frozen=True)
class Mount:
    """A host path bound at a fixed path inside the container (``/app``: the workspace)."""

    source: Path
    target: str
    writable: bool = False


def _docker() -> str:
    exe = shutil.which("docker")
    if exe is None:
        raise SandboxError("docker sandbox unavailable: no docker CLI on PATH")
    return exe


def docker_unavailable(image: str = BASE_IMAGE) -> str | None:
    """Why the Docker sandbox cannot run here (no CLI, no daemon answering, no ``image``), or None if it can."""
    exe = shutil.which("docker")
    if exe is None:
        return "no docker CLI on PATH (apt-get install docker.io)"
    try:
        version = subprocess.run(
            [exe, "version", "-f", "{{.Server.Version}}"], capture_output=True, text=True, timeout=20, check=False
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"docker CLI failed: {exc}"
    if version.returncode != 0:
        return f"no Docker daemon answers ({version.stderr.strip().splitlines()[-1:] or ['?']})"
    probe = subprocess.run([exe, "image", "inspect", image], capture_output=True, timeout=20, check=False)
    if probe.returncode != 0:
        return f"image {image} is not built (make sandbox-image)"
    return None


def _not_started(stderr: str, program: str) -> bool:
    """Whether the container's init (tini) or the limits' shell said it could not exec ``program``: then the
    command never ran, which is the sandbox's failure to report, not an exit code of the command's own."""
    lines = stderr.strip().splitlines()
    if not lines:
        return False
    last = lines[-1]
    return (last.startswith("[FATAL tini") and f"exec {program} failed" in last) or last.startswith(
        f"sandbox: 1: exec: {program}: "
    )


def _drain(stream: IO[bytes], keep: int, sink: bytearray) -> None:
    with stream:
        while chunk := os.read(stream.fileno(), 1 << 16):
            if len(sink) < keep:
                sink += chunk[: keep - len(sink)]


def _feed(stream: IO[bytes] | None, data: bytes) -> None:
    assert stream is not None
    with contextlib.suppress(OSError), stream:
        stream.write(data)


def _own_user() -> str:
    """The caller's uid:gid where it is not root (the mounts are its own files), else nobody's."""
    uid, gid = os.getuid(), os.getgid()
    return _NOBODY if uid == 0 else f"{uid}:{gid}"


def _hand_over(root: Path, uid: int, gid: int) -> None:
    """A root caller's writable mount, given to the container's unprivileged user (who must write there)."""
    for dirpath, dirnames, filenames in os.walk(root):
        os.lchown(dirpath, uid, gid)
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, gid)


class DockerSandbox:
    """``with DockerSandbox(image=tag, mounts=[Mount(ws, "/app", True)]) as sb: sb.run(["bash", "x.sh"], cwd="/app")``.

    ``user``: who the command runs as inside (``uid:gid``, never root); default the caller's own ids, or
    nobody's (65534) for a root caller, whose writable mounts are then chowned to it when the sandbox opens.
    ``cpus``: the container's CPU quota (``--cpus``), None for no quota. ``labels``: added to each container's.
    """

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        *,
        image: str = BASE_IMAGE,
        mounts: Sequence[Mount] = (),
        user: str | None = None,
        cpus: float | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.limits.validate()
        self.image = image
        self.mounts = tuple(mounts)
        self.user = user or _own_user()
        self.cpus = cpus
        self.labels = dict(labels or {})
        uid, _, gid = self.user.partition(":")
        if not (uid.isdigit() and gid.isdigit()):
            raise ValueError(f"user must be numeric uid:gid, got {self.user!r}")
        if int(uid) == 0 or int(gid) == 0:
            raise ValueError("the docker sandbox never runs commands as root (uid or gid 0)")
        if cpus is not None and not cpus > 0:
            raise ValueError("cpus must be > 0")
        targets = set()
        for m in self.mounts:
            t = PurePosixPath(m.target)
            if not t.is_absolute() or ".." in t.parts or str(t) == "/":
                raise ValueError(f"mount target must be an absolute path below /, got {m.target!r}")
            if str(t) in targets:
                raise ValueError(f"two mounts at {m.target}")
            targets.add(str(t))
        self._open = False

    def open(self) -> DockerSandbox:
        for m in self.mounts:
            if not Path(m.source).exists():
                raise SandboxError(f"docker sandbox: mount source {m.source} does not exist")
        uid, _, gid = self.user.partition(":")
        if os.getuid() == 0:
            for m in self.mounts:
                if m.writable:
                    _hand_over(Path(m.source), int(uid), int(gid))
        self._open = True
        return self

    def close(self) -> None:
        self._open = False

    def __enter__(self) -> DockerSandbox:
        return self.open()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def _argv(
        self, name: str, argv: Sequence[str], cwd: str, env: Mapping[str, str], lim: SandboxLimits, stdin: bool
    ) -> list[str]:
        cmd = [
            _docker(), "run", "--name", name, "--label", f"{LABEL}=1", "--init", "--network", "none",
            "--user", self.user, "--read-only", "--tmpfs", _TMPFS, "--cap-drop", "ALL",
            "--security-opt", "no-new-privileges", "--log-driver", "none", "--pull", "never",
            "--ulimit", "core=0", "--workdir", cwd,
        ]  # fmt: skip
        if lim.max_processes is not None:  # a pids cgroup: the container's own processes and threads only
            cmd += ["--pids-limit", str(lim.max_processes)]
        for k, v in self.labels.items():
            cmd += ["--label", f"{k}={v}"]
        if stdin:
            cmd.append("--interactive")
        if lim.group_memory_mb is not None:  # the container's cgroup: all its processes together, no swap
            mem = f"{lim.group_memory_mb}m"
            cmd += ["--memory", mem, "--memory-swap", mem]
        if lim.cpu_s is not None:
            cmd += ["--ulimit", f"cpu={lim.cpu_s}"]
        if self.cpus is not None:
            cmd += ["--cpus", str(self.cpus)]
        for m in self.mounts:
            src = str(Path(m.source).resolve())
            if "," in src or "," in m.target:
                raise SandboxError(f"docker sandbox: a mount path holds a comma: {src} -> {m.target}")
            cmd += ["--mount", f"type=bind,source={src},target={m.target}" + ("" if m.writable else ",readonly")]
        for k, v in env.items():
            cmd += ["--env", f"{k}={v}"]
        cmd.append(self.image)
        if lim.memory_mb is not None:
            # Docker has no RLIMIT_AS ulimit: the image's shell sets it, as the local sandbox's "ulimit" limiter.
            script = f'ulimit -v {lim.memory_mb * 1024}; exec "$@"'
            cmd += ["/bin/sh", "-c", script, "sandbox"]
        return [*cmd, *argv]

    def run(
        self,
        argv: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        stdin: bytes | None = None,
        limits: SandboxLimits | None = None,
    ) -> SandboxResult:
        """Run ``argv`` in a fresh container. ``cwd``: an absolute path inside (default the first mount's
        target, else /tmp); ``env``: the whole environment beside PATH, HOME=/tmp and TMPDIR=/tmp."""
        if not self._open:
            raise SandboxError("the sandbox is not open")
        if not argv:
            raise SandboxError("docker sandbox: empty argv")
        lim = limits or self.limits
        lim.validate()
        workdir = cwd if cwd is not None else (self.mounts[0].target if self.mounts else "/tmp")
        if not PurePosixPath(workdir).is_absolute():
            raise SandboxError(f"docker sandbox: cwd must be an absolute path inside the container, got {workdir!r}")
        run_env = {"HOME": "/tmp", "TMPDIR": "/tmp", **(env or {})}
        name = f"og-sb-{uuid.uuid4().hex[:16]}"
        cmd = self._argv(name, argv, workdir, run_env, lim, stdin is not None)
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"docker sandbox failed to start docker: {exc}") from exc
        try:
            out, err, timed_out = self._collect(proc, name, stdin, lim)
            state = self._state(name) if proc.returncode in (125, 137) or timed_out else None
        finally:
            if proc.poll() is None:  # interrupted
                self._kill(name)
                proc.wait()
            self._remove(name)
        code = proc.returncode
        stderr = err.decode("utf-8", errors="replace")
        if not timed_out and code == 125 and state is None:
            # The daemon refused the container (bad image, bad option): not the command's failure.
            raise SandboxError(f"docker sandbox could not start the container: {stderr.strip()}")
        if not timed_out and code in (126, 127) and _not_started(stderr, argv[0]):
            raise SandboxError(f"docker sandbox failed to start {argv[0]!r}: {stderr.strip()}")
        exceeded = bool(state and state.get("OOMKilled")) and not timed_out
        exit_code = 124 if timed_out else 137 if exceeded else code
        return SandboxResult(
            exit_code=exit_code,
            stdout=out.decode("utf-8", errors="replace"),
            stderr=stderr,
            timed_out=timed_out,
            duration_s=time.monotonic() - start,
            network_isolated=True,
            memory_exceeded=exceeded,
            # docker's init ends as its command did, 128 + the signal for a signalled one: the number is the
            # signal unless the command chose such an exit code itself, which the container cannot tell apart.
            signal=None,
        )

    def _collect(
        self, proc: subprocess.Popen[bytes], name: str, stdin: bytes | None, lim: SandboxLimits
    ) -> tuple[bytes, bytes, bool]:
        out, err = bytearray(), bytearray()
        assert proc.stdout is not None and proc.stderr is not None
        workers = [
            threading.Thread(target=_drain, args=(proc.stdout, lim.max_output_bytes, out), daemon=True),
            threading.Thread(target=_drain, args=(proc.stderr, lim.max_output_bytes, err), daemon=True),
        ]
        if stdin is not None:
            workers.append(threading.Thread(target=_feed, args=(proc.stdin, stdin), daemon=True))
        for w in workers:
            w.start()
        timed_out = False
        try:
            proc.wait(lim.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._kill(name)
            try:
                proc.wait(_CLI_GRACE_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for w in workers:
            w.join(_PIPE_GRACE_S)
        return bytes(out), bytes(err), timed_out

    @staticmethod
    def _kill(name: str) -> None:
        subprocess.run([_docker(), "kill", name], capture_output=True, timeout=_CLI_GRACE_S, check=False)

    @staticmethod
    def _remove(name: str) -> None:
        subprocess.run([_docker(), "rm", "-f", name], capture_output=True, timeout=_CLI_GRACE_S, check=False)

    @staticmethod
    def _state(name: str) -> dict[str, object] | None:
        probe = subprocess.run(
            [_docker(), "inspect", "-f", "{{json .State}}", name], capture_output=True, timeout=_CLI_GRACE_S
        )
        if probe.returncode != 0:
            return None  # no such container: the daemon never made it
        state: dict[str, object] = json.loads(probe.stdout)
        return state
