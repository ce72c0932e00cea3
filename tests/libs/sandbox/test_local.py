"""The local process sandbox: a private directory, limits that bite, exit codes in shell convention."""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits, network_isolation_available


def test_runs_in_a_private_directory_with_a_clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OG_SECRET_TOKEN", "do-not-leak")
    with LocalSandbox() as sb:
        root = sb.root
        (root / "work").mkdir()
        r = sb.run(["bash", "-c", 'pwd; echo "$HOME"; echo "${OG_SECRET_TOKEN:-none}"; touch made'], cwd="work")
        assert r.ok and r.exit_code == 0
        cwd, home, secret = r.stdout.split()
        assert Path(cwd) == root / "work" and Path(home) == root / "home" and secret == "none"
        assert (root / "work" / "made").exists()
    assert not root.exists()
    with pytest.raises(SandboxError):
        _ = sb.root


def test_system_programs_come_before_the_hosts_shims(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A host's version-manager shim (pyenv's ``python3``) must not shadow the system's program in the sandbox,
    which stands in for a container's substrate; what only the host's PATH has is still found."""
    shims = tmp_path / "shims"
    shims.mkdir()
    for name in ("bash", "only-on-the-host"):
        (shims / name).write_text("#!/bin/sh\necho shim\n")
        (shims / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    with LocalSandbox() as sb:
        r = sb.run(["bash", "-c", "command -v bash; echo $BASH_VERSION"])
        own = sb.run(["only-on-the-host"])
    where, version = r.stdout.split()
    assert r.ok and Path(where).parent != shims and version  # a real bash ran, found in a system directory
    assert own.ok and own.stdout.strip() == "shim"


def test_timeout_kills_the_whole_group_and_exits_124() -> None:
    with LocalSandbox(SandboxLimits(timeout_s=1.0)) as sb:
        r = sb.run(["bash", "-c", "sleep 60 & sleep 60; echo never"])
    assert r.timed_out and r.exit_code == 124 and "never" not in r.stdout


def _gone(pid: int) -> bool:
    """Dead (or a zombie nobody reaped yet), waiting a while for a SIGKILL to land."""
    stat = Path(f"/proc/{pid}/stat")
    for _ in range(100):
        try:
            if stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.1)
    return False


def test_what_a_command_leaves_running_dies_when_it_ends() -> None:
    with LocalSandbox() as sb:
        r = sb.run(["bash", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"])
    assert r.ok and not r.timed_out
    pid = int(r.stdout)
    gone = _gone(pid)
    if not gone:
        os.kill(pid, signal.SIGKILL)
    assert gone, "a background process outlived its sandboxed command"


def test_a_command_ends_when_it_exits_though_a_setsid_child_holds_its_output() -> None:
    """A child that left the command's session keeps stdout open: the result is still the command's exit (not a
    timeout once the child ends), and the child dies with the command."""
    with LocalSandbox(SandboxLimits(timeout_s=30.0)) as sb:
        r = sb.run(["bash", "-c", "setsid sleep 100 & echo $!; exit 0"])
    assert r.ok and not r.timed_out and r.exit_code == 0
    pid = int(r.stdout)
    gone = _gone(pid)
    if not gone:
        os.kill(pid, signal.SIGKILL)
    assert gone, "a setsid child outlived its sandboxed command"


def test_a_timeout_kills_what_a_double_fork_left_outside_the_session() -> None:
    with LocalSandbox(SandboxLimits(timeout_s=1.0)) as sb:
        r = sb.run(["bash", "-c", "( setsid sleep 100 >/dev/null 2>&1 & echo $! ); echo up; exec sleep 100"])
    assert r.timed_out and r.exit_code == 124
    pid = int(r.stdout.split()[0])
    gone = _gone(pid)
    if not gone:
        os.kill(pid, signal.SIGKILL)
    assert gone, "an orphaned, setsid process outlived its timed-out command"


def test_signal_kill_is_137() -> None:
    with LocalSandbox() as sb:
        r = sb.run(["bash", "-c", "kill -9 $$"])
    assert r.exit_code == 137 and not r.timed_out
    assert r.signal == 9 and not r.memory_exceeded  # a SIGKILL the sandbox did not send, and it says so


# Two processes of 40 MB each (touched, so resident): under a per-process limit, over a group limit of 64 MB.
HOG = "x = b'a' * (40 << 20); import time; time.sleep(60)"


def test_group_memory_limit_kills_all_the_commands_processes() -> None:
    limits = SandboxLimits(timeout_s=60.0, memory_mb=512, group_memory_mb=64)
    with LocalSandbox(limits) as sb:
        r = sb.run(["bash", "-c", f'{sys.executable} -c "{HOG}" & {sys.executable} -c "{HOG}"; echo never'])
    assert r.memory_exceeded and r.exit_code == 137 and r.signal is None
    assert not r.timed_out and "never" not in r.stdout
    with LocalSandbox(SandboxLimits(timeout_s=60.0, group_memory_mb=64)) as sb:
        small = sb.run([sys.executable, "-c", "x = b'a' * (8 << 20); print('ok')"])
    assert small.ok and small.stdout.strip() == "ok" and not small.memory_exceeded


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_memory_limit_bites(limiter: str) -> None:
    with LocalSandbox(SandboxLimits(memory_mb=200, limiter=limiter)) as sb:
        r = sb.run([sys.executable, "-c", "x = bytearray(600 * 1024 * 1024); print('allocated')"])
    assert r.exit_code != 0 and "allocated" not in r.stdout and "MemoryError" in r.stderr


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_every_limit_is_applied(limiter: str) -> None:
    # The process limit counts the user's processes: take one far above them, below the hard limit.
    hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nproc = 1_000_003 if hard == resource.RLIM_INFINITY else hard - 1
    code = (
        "import resource as r; "
        "print(*(r.getrlimit(x)[0] for x in (r.RLIMIT_AS, r.RLIMIT_CPU, r.RLIMIT_NPROC, r.RLIMIT_CORE)))"
    )
    limits = SandboxLimits(memory_mb=300, cpu_s=7, max_processes=nproc, limiter=limiter)
    with LocalSandbox(limits) as sb:
        r = sb.run([sys.executable, "-c", code])
    assert r.ok, r.stderr
    assert [int(x) for x in r.stdout.split()] == [300 * 1024 * 1024, 7, nproc, 0]


def test_output_is_capped() -> None:
    with LocalSandbox(SandboxLimits(max_output_bytes=100)) as sb:
        r = sb.run(["bash", "-c", "head -c 5000 /dev/zero | tr '\\0' a"])
    assert len(r.stdout) == 100


def test_output_past_the_cap_is_never_held_in_memory() -> None:
    tracemalloc.start()
    try:
        with LocalSandbox(SandboxLimits(max_output_bytes=100)) as sb:
            r = sb.run(["head", "-c", "50000000", "/dev/zero"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.ok and len(r.stdout) == 100
    assert peak < 8 * 1024 * 1024  # 50 MB went through; only the cap (and a read buffer) was kept


def test_stdin_is_fed_and_a_command_that_ignores_it_still_ends() -> None:
    with LocalSandbox() as sb:
        assert sb.run(["cat"], stdin=b"hello").stdout == "hello"
        r = sb.run(["true"], stdin=b"x" * (1 << 20))  # more than a pipe holds, never read
    assert r.ok and not r.timed_out


def test_copy_in_and_missing_executable() -> None:
    with LocalSandbox() as sb:
        src = sb.root / "home" / "f.txt"
        src.write_text("hi")
        assert sb.copy_in(src, "a/b/f.txt").read_text() == "hi"
        with pytest.raises(SandboxError):
            sb.run(["/nonexistent/binary"])


def test_copy_in_leaves_out_what_cannot_be_copied(tmp_path: Path) -> None:
    tree = tmp_path / "ws"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "f.txt").write_text("kept")
    (tree / "link").symlink_to("sub/f.txt")
    os.mkfifo(tree / "pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tree / "dead.sock"))  # what a server the agent started leaves behind
    try:
        with LocalSandbox() as sb:
            copied = sb.copy_in(tree, "app")
            assert sorted(p.name for p in copied.iterdir()) == ["link", "sub"]
            assert (copied / "link").read_text() == "kept"
            with pytest.raises(SandboxError):
                sb.copy_in(tmp_path / "missing", "gone")
    finally:
        server.close()


@pytest.mark.skipif(not network_isolation_available(), reason="the OS forbids unprivileged network namespaces")
def test_no_network_inside() -> None:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2); print('connected')"
    try:
        with LocalSandbox() as sb:
            isolated = sb.run([sys.executable, "-c", code])
            open_net = sb.run([sys.executable, "-c", code], limits=SandboxLimits(network=True))
    finally:
        server.close()
    assert isolated.network_isolated and isolated.exit_code != 0 and "connected" not in isolated.stdout
    assert not open_net.network_isolated and "connected" in open_net.stdout


@pytest.mark.parametrize("limiter", ["prlimit", "ulimit"])
def test_cpu_limit_kills_a_spinning_process(limiter: str) -> None:
    with LocalSandbox(SandboxLimits(cpu_s=1, timeout_s=60, limiter=limiter)) as sb:
        r = sb.run(["bash", "-c", "while :; do :; done"])
    assert not r.timed_out and r.exit_code in (128 + 9, 128 + 24)  # SIGKILL or SIGXCPU from RLIMIT_CPU


def test_unknown_limiter_is_refused() -> None:
    with pytest.raises(ValueError):
        LocalSandbox(SandboxLimits(limiter="cgroups"))
