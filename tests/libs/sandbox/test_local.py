"""Every backend's contract: a private directory, limits that bite, exit codes in shell convention, nothing left
running. Each test runs on the namespace backend (the default) and on the process backend (``none``)."""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import tracemalloc
import uuid
from pathlib import Path

import pytest

from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits, network_isolation_available
from opengyre.sandbox._cgroup import pids_cgroup_parent
from tests._polling import wait_until

BACKENDS = ["namespace", "none"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_runs_in_a_private_directory_with_a_clean_env(monkeypatch: pytest.MonkeyPatch, backend: str) -> None:
    monkeypatch.setenv("OG_SECRET_TOKEN", "do-not-leak")
    with LocalSandbox(backend=backend) as sb:
        root = sb.root
        (root / "work").mkdir()
        r = sb.run(["bash", "-c", 'pwd; echo "$HOME"; echo "${OG_SECRET_TOKEN:-none}"; touch made'], cwd="work")
        assert r.ok and r.exit_code == 0
        cwd, home, secret = r.stdout.split()
        assert Path(cwd) == root / "work" and home == sb.env()["HOME"] and secret == "none"
        assert (root / "work" / "made").exists()
        assert sb.run(["bash", "-c", 'touch "$HOME/mine"']).ok and (root / "home" / "mine").exists()
    assert not root.exists()
    with pytest.raises(SandboxError):
        _ = sb.root


def test_system_programs_come_before_the_hosts_shims(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, backend: str
) -> None:
    """A host's version-manager shim (pyenv's ``python3``) must not shadow the system's program in the sandbox,
    which stands in for a container's substrate; what only the host's PATH has is still found."""
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("bash", "only-on-the-host"):
        (shims / name).write_text("#!/bin/sh\necho shim\n")
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    with LocalSandbox(backend=backend) as sb:
        r = sb.run(["bash", "-c", "command -v bash; echo $BASH_VERSION"])
        if backend == "none":
            own = sb.run(["only-on-the-host"])
            assert own.ok and own.stdout.strip() == "shim"
        else:  # the host's directories are not the namespace sandbox's: its PATH keeps only what it sees
            with pytest.raises(SandboxError, match="not found"):
                sb.run(["only-on-the-host"])
    where, version = r.stdout.split()
    assert r.ok and Path(where).parent != shims and version  # a real bash ran, found in a system directory


def test_timeout_kills_the_whole_group_and_exits_124(backend: str) -> None:
    with LocalSandbox(SandboxLimits(timeout_s=1.0), backend=backend) as sb:
        r = sb.run(["bash", "-c", "sleep 60 & sleep 60; echo never"])
    assert r.timed_out and r.exit_code == 124 and "never" not in r.stdout


def _marker() -> str:
    """A sleep duration no other process on the machine has in its argv (a pid inside a pid namespace is not the
    host's: the tests find the command's processes on the host by this)."""
    return f"299.{uuid.uuid4().int % 10**12:012d}"


def _until_started(marker: str) -> str:
    """Shell: wait until a process with ``marker`` in its argv runs (the bracket keeps grep from matching itself)."""
    return f"until grep -qs '{marker[:2]}[{marker[2]}]{marker[3:]}' /proc/[0-9]*/cmdline; do :; done"


def _host_pids(marker: str) -> list[int]:
    """Live (not zombie) host processes with ``marker`` in their argv."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
            state = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in argv and state != "Z":
            out.append(int(name))
    return out


def _sleeps(marker: str) -> list[int]:
    out = []
    for pid in _host_pids(marker):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                out.append(pid)
        except OSError:
            continue  # gone meanwhile
    return out


def _assert_all_gone(marker: str, what: str) -> None:
    try:
        wait_until(lambda: not _host_pids(marker), what, polls=100, every=0.1)
    finally:
        for pid in _host_pids(marker):
            os.kill(pid, signal.SIGKILL)


def test_what_a_command_leaves_running_dies_when_it_ends(backend: str) -> None:
    m = _marker()
    with LocalSandbox(backend=backend) as sb:
        r = sb.run(["bash", "-c", f"sleep {m} >/dev/null 2>&1 & {_until_started(m)}; echo started"])
    assert r.ok and not r.timed_out and r.stdout.strip() == "started"
    _assert_all_gone(m, "a background process outlived its sandboxed command")


def test_a_command_ends_when_it_exits_though_a_setsid_child_holds_its_output(backend: str) -> None:
    """A child that left the command's session keeps stdout open: the result is still the command's exit (not a
    timeout once the child ends), and the child dies with the command."""
    m = _marker()
    with LocalSandbox(SandboxLimits(timeout_s=30.0), backend=backend) as sb:
        r = sb.run(["bash", "-c", f"setsid sleep {m} & {_until_started(m)}; echo started; exit 0"])
    assert r.ok and not r.timed_out and r.exit_code == 0 and r.stdout.strip() == "started"
    _assert_all_gone(m, "a setsid child outlived its sandboxed command")


def test_a_timeout_kills_what_a_double_fork_left_outside_the_session(backend: str) -> None:
    m = _marker()
    with LocalSandbox(SandboxLimits(timeout_s=1.0), backend=backend) as sb:
        r = sb.run(
            ["bash", "-c", f"( setsid sleep {m} >/dev/null 2>&1 & ); {_until_started(m)}; echo up; exec sleep 100"]
        )
    assert r.timed_out and r.exit_code == 124 and r.stdout.strip() == "up"
    _assert_all_gone(m, "an orphaned, setsid process outlived its timed-out command")


def test_signal_kill_is_137(backend: str) -> None:
    with LocalSandbox(backend=backend) as sb:
        r = sb.run(["bash", "-c", "kill -9 $$"])
    assert r.exit_code == 137 and not r.timed_out
    assert r.signal == 9 and not r.memory_exceeded  # a SIGKILL the sandbox did not send, and it says so


# Two processes of 40 MB each (touched, so resident): under a per-process limit, over a group limit of 64 MB.
HOG = "x = b'a' * (40 << 20); import time; time.sleep(60)"


def test_group_memory_limit_kills_all_the_commands_processes(backend: str) -> None:
    limits = SandboxLimits(timeout_s=60.0, memory_mb=512, group_memory_mb=64)
    with LocalSandbox(limits, backend=backend) as sb:
        r = sb.run(["bash", "-c", f'{sys.executable} -c "{HOG}" & {sys.executable} -c "{HOG}"; echo never'])
    assert r.memory_exceeded and r.exit_code == 137 and r.signal is None
    assert not r.timed_out and "never" not in r.stdout
    with LocalSandbox(SandboxLimits(timeout_s=60.0, group_memory_mb=64), backend=backend) as sb:
        small = sb.run([sys.executable, "-c", "x = b'a' * (8 << 20); print('ok')"])
    assert small.ok and small.stdout.strip() == "ok" and not small.memory_exceeded


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_memory_limit_bites(limiter: str, backend: str) -> None:
    with LocalSandbox(SandboxLimits(memory_mb=200, limiter=limiter), backend=backend) as sb:
        r = sb.run([sys.executable, "-c", "x = bytearray(600 * 1024 * 1024); print('allocated')"])
    assert r.exit_code != 0 and "allocated" not in r.stdout and "MemoryError" in r.stderr


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_every_limit_is_applied(limiter: str, backend: str) -> None:
    # The process limit counts the user's processes: take one far above them, below the hard limit.
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 1_000_003 if hard == resource.RLIM_INFINITY else hard - 1
    code = (
        "import resource as r; "
        "print(*(r.getrlimit(x)[0] for x in (r.RLIMIT_AS, r.RLIMIT_CPU, r.RLIMIT_NPROC, r.RLIMIT_CORE, r.RLIMIT_FSIZE)))"
    )
    limits = SandboxLimits(memory_mb=300, cpu_s=7, max_processes=nproc, disk_mb=50, limiter=limiter)
    with LocalSandbox(limits, backend=backend) as sb:
        r = sb.run([sys.executable, "-c", code])
    assert r.ok, r.stderr
    # The process limit is a pids cgroup where one can be made (tests/libs/sandbox/test_isolation.py forks past
    # it), and RLIMIT_NPROC too but where it would count another user's every process (the process backend).
    as_rlimit = backend == "namespace" or pids_cgroup_parent() is None or os.geteuid() == 0
    expected_nproc = nproc if as_rlimit else resource.getrlimit(resource.RLIMIT_NPROC)[0]
    assert [int(x) for x in r.stdout.split()] == [300 * 1024 * 1024, 7, expected_nproc, 0, 50 * 1024 * 1024]


def test_output_is_capped(backend: str) -> None:
    with LocalSandbox(SandboxLimits(max_output_bytes=100), backend=backend) as sb:
        r = sb.run(["bash", "-c", "head -c 5000 /dev/zero | tr '\\0' a"])
    assert len(r.stdout) == 100


def test_output_past_the_cap_is_never_held_in_memory(backend: str) -> None:
    tracemalloc.start()
    try:
        with LocalSandbox(SandboxLimits(max_output_bytes=100), backend=backend) as sb:
            r = sb.run(["head", "-c", "50000000", "/dev/zero"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.ok and len(r.stdout) == 100
    assert peak < 8 * 1024 * 1024  # 50 MB went through; only the cap (and a read buffer) was kept


def test_stdin_is_fed_and_a_command_that_ignores_it_still_ends(backend: str) -> None:
    with LocalSandbox(backend=backend) as sb:
        assert sb.run(["cat"], stdin=b"hello").stdout == "hello"
        r = sb.run(["true"], stdin=b"x" * (1 << 20))  # more than a pipe holds, never read
    assert r.ok and not r.timed_out


def test_copy_in_and_missing_executable(backend: str) -> None:
    with LocalSandbox(backend=backend) as sb:
        src = sb.root / "home" / "f.txt"
        src.write_text("hi")
        assert sb.copy_in(src, "a/b/f.txt").read_text() == "hi"
        with pytest.raises(SandboxError):
            sb.run(["/nonexistent/binary"])


def test_copy_in_leaves_out_what_cannot_be_copied(tmp_path: Path, backend: str) -> None:
    tree = tmp_path / "ws"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("kept")
    (tree / "link").symlink_to("sub/f.txt")
    os.mkfifo(tree / "pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tree / "dead.sock"))  # what a server the agent started leaves behind
    try:
        with LocalSandbox(backend=backend) as sb:
            copied = sb.copy_in(tree, "app")
            assert sorted(p.name for p in copied.iterdir()) == ["link", "sub"]
            assert (copied / "link").read_text() == "kept"
            with pytest.raises(SandboxError):
                sb.copy_in(tmp_path / "missing", "gone")
    finally:
        server.close()


@pytest.mark.skipif(not network_isolation_available(), reason="the OS forbids unprivileged network namespaces")
def test_no_network_inside(backend: str) -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    try:
        with LocalSandbox(backend=backend) as sb:
            isolated = sb.run([sys.executable, "-c", code])
            if backend == "none":
                open_net = sb.run([sys.executable, "-c", code], limits=SandboxLimits(network=True))
                assert not open_net.network_isolated and "connected" in open_net.stdout
            else:  # the host's network is never the namespace sandbox's: egress endpoints are its way out
                with pytest.raises(SandboxError, match="egress"):
                    sb.run([sys.executable, "-c", code], limits=SandboxLimits(network=True))
    finally:
        server.close()
    assert isolated.network_isolated and isolated.exit_code != 0 and "connected" not in isolated.stdout


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_cpu_limit_kills_a_spinning_process(limiter: str, backend: str) -> None:
    with LocalSandbox(SandboxLimits(cpu_s=1, timeout_s=60, limiter=limiter), backend=backend) as sb:
        r = sb.run(["bash", "-c", "while :; do :; done"])
    assert not r.timed_out and r.exit_code in (128 + 9, 128 + 24)  # SIGKILL or SIGXCPU from RLIMIT_CPU


def test_unknown_limiter_is_refused(backend: str) -> None:
    with pytest.raises(ValueError):
        LocalSandbox(SandboxLimits(limiter="cgroups"), backend=backend)


def test_a_sigkill_from_outside_the_sandbox_is_signal_9(backend: str) -> None:
    """What the system's OOM killer does: a SIGKILL from the host to the command's process (found by its argv:
    a pid inside a pid namespace is not the host's) is reported as the signal, not as the sandbox's doing."""
    import threading

    m = _marker()
    results = []
    with LocalSandbox(SandboxLimits(timeout_s=60), backend=backend) as sb:
        t = threading.Thread(target=lambda: results.append(sb.run(["sleep", m])))
        t.start()
        try:
            wait_until(lambda: _sleeps(m), "the command started", polls=300, every=0.05)
            [pid] = _sleeps(m)  # the command itself, not the launchers whose argv hold it too
            os.kill(pid, signal.SIGKILL)
        finally:
            t.join(60)
    [r] = results
    assert (r.exit_code, r.signal, r.timed_out, r.memory_exceeded) == (137, 9, False, False)
