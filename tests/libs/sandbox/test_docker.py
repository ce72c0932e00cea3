"""The Docker sandbox, against a real daemon and the real base image: a fresh container per command, limits that
bite, exit codes in shell convention, no network but the allowed loopback endpoints.

Skipped, with the reason, where no Docker daemon answers or the base image is not built (``make sandbox-image``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from opengyre.sandbox import (
    BASE_IMAGE,
    DockerSandbox,
    LocalSandbox,
    Mount,
    SandboxError,
    SandboxLimits,
    check_docker,
    docker_unavailable,
)

from ..._polling import wait_until
from ._servers import echo_server

_WHY = docker_unavailable(BASE_IMAGE)
pytestmark = pytest.mark.skipif(_WHY is not None, reason=f"docker sandbox: {_WHY}")


def _host_has(marker: str) -> bool:
    """Whether a process whose command line holds ``marker`` runs on the host (containers' processes show)."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{name}/cmdline").read_bytes():
                    return True
            except OSError:
                continue
    return False


def _containers(label_value: str) -> list[str]:
    out = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=og.test={label_value}"], capture_output=True, text=True, check=True
    )
    return out.stdout.split()


def test_runs_unprivileged_on_a_read_only_root_with_the_workspace_at_app(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "given.txt").write_text("from the host")
    with DockerSandbox(mounts=[Mount(ws, "/app", writable=True)]) as sb:
        r = sb.run(
            [
                "sh",
                "-c",
                "id -u; pwd; cat given.txt; echo; echo made > made.txt; grep CapEff /proc/self/status;"
                "touch /etc/x 2>/dev/null && echo root-writable; touch /tmp/ok && echo tmp-writable",
            ],
            cwd="/app",
        )
    assert r.ok, r.stderr
    uid, cwd, given, caps, tmp = r.stdout.splitlines()
    assert uid != "0" and cwd == "/app" and given == "from the host"
    assert caps.split()[1] == "0000000000000000" and tmp == "tmp-writable"  # no capability, root not writable
    assert (ws / "made.txt").read_text() == "made\n" and r.network_isolated and r.isolation == "docker"


def test_a_read_only_mount_cannot_be_written(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir(mode=0o777)  # pytest's tmp_path is the caller's alone; the container's user must read this one
    data.chmod(0o777)  # world-writable even: the mount, not the permissions, is what refuses the write
    (data / "f").write_text("x")
    (data / "f").chmod(0o666)
    with DockerSandbox(mounts=[Mount(data, "/data", writable=False)]) as sb:
        r = sb.run(["sh", "-c", "cat /data/f; echo y > /data/f"])
    assert r.exit_code != 0 and r.stdout == "x" and "Read-only file system" in r.stderr
    assert (data / "f").read_text() == "x"


def test_exit_codes_follow_the_shell_convention() -> None:
    with DockerSandbox() as sb:
        assert sb.run(["sh", "-c", "exit 3"]).exit_code == 3
        killed = sb.run(["sh", "-c", "kill -9 $$"])
    assert killed.exit_code == 137 and killed.signal == 9 and not killed.memory_exceeded and not killed.timed_out


def test_timeout_kills_the_container_and_exits_124() -> None:
    with DockerSandbox(SandboxLimits(timeout_s=2.0)) as sb:
        r = sb.run(["sh", "-c", "sleep 424242 & sleep 424243; echo never"])
    assert r.timed_out and r.exit_code == 124 and "never" not in r.stdout
    assert not _host_has("424242") and not _host_has("424243")


def test_what_a_command_leaves_running_dies_with_its_container() -> None:
    with DockerSandbox() as sb:
        r = sb.run(["sh", "-c", "setsid sleep 525252 >/dev/null 2>&1 & echo started"])
    assert r.ok and r.stdout.strip() == "started"
    wait_until(lambda: not _host_has("525252"), "a background process outlived its container")


def test_the_memory_cgroup_kills_and_says_so() -> None:
    lim = SandboxLimits(memory_mb=None, group_memory_mb=64)
    with DockerSandbox(lim) as sb:
        r = sb.run(["python3", "-c", "x = bytearray(256 << 20); print('held')"])
    assert r.exit_code == 137 and r.memory_exceeded and "held" not in r.stdout


def test_the_per_process_memory_limit_bites() -> None:
    with DockerSandbox(SandboxLimits(memory_mb=64)) as sb:
        r = sb.run(["python3", "-c", "x = bytearray(256 << 20); print('held')"])
    assert r.exit_code != 0 and "MemoryError" in r.stderr and not r.memory_exceeded


_SPAWN_40 = """
import subprocess
import sys
kids = []
try:
    for _ in range(40):
        kids.append(subprocess.Popen(["sleep", "30"]))
    print("all", len(kids))
except OSError:
    print("stopped", len(kids))
"""


def test_the_pids_limit_stops_a_fork_bomb() -> None:
    with DockerSandbox(SandboxLimits(max_processes=16, timeout_s=60)) as sb:
        r = sb.run(["python3", "-c", _SPAWN_40])
    kind, count = r.stdout.split()
    assert r.ok and kind == "stopped" and int(count) < 16, r.stdout  # the init and python3 count too


def test_output_is_capped_and_stdin_is_fed() -> None:
    with DockerSandbox(SandboxLimits(max_output_bytes=1000)) as sb:
        big = sb.run(["sh", "-c", "yes x | head -c 1000000"])
        fed = sb.run(["cat"], stdin=b"fed in")
    assert big.ok and len(big.stdout) == 1000
    assert fed.ok and fed.stdout == "fed in"


def test_a_missing_program_is_the_sandboxs_error() -> None:
    with DockerSandbox() as sb, pytest.raises(SandboxError, match="no-such-program"):
        sb.run(["no-such-program"])


def test_no_network_a_host_loopback_listener_is_out_of_reach() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = (
            "import os, socket\n"
            "print(sorted(os.listdir('/sys/class/net')))\n"
            f"try:\n    socket.create_connection(('127.0.0.1', {port}), timeout=5); print('reached')\n"
            "except OSError as e:\n    print('refused', type(e).__name__)\n"
        )
        with DockerSandbox() as sb:
            r = sb.run(["python3", "-c", probe])
    nets, outcome = r.stdout.splitlines()
    assert r.ok and nets == "['lo']" and outcome.startswith("refused"), r.stdout


def test_containers_are_removed_after_every_run() -> None:
    with DockerSandbox(SandboxLimits(timeout_s=2.0), labels={"og.test": "removed"}) as sb:
        sb.run(["true"])
        sb.run(["sh", "-c", "exit 5"])
        sb.run(["sleep", "60"])
    assert _containers("removed") == []


_CALL = """
import socket, sys
for port in map(int, sys.argv[1:]):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"ping")
        print(port, s.recv(64).decode() or "closed")
    except OSError as e:
        print(port, "refused", type(e).__name__)
"""


def test_egress_reaches_the_allowed_endpoint_and_nothing_else() -> None:
    allowed, allowed_port = echo_server()
    other, other_port = echo_server()
    try:
        with DockerSandbox(egress=[f"127.0.0.1:{allowed_port}"]) as sb:
            r = sb.run(["python3", "-c", _CALL, str(allowed_port), str(other_port)])
            killed = sb.run(["sh", "-c", "kill -9 $$"])  # the forwarder reports the status as the shim does
    finally:
        allowed.close()
        other.close()
    assert r.ok, r.stderr
    got = dict(line.split(" ", 1) for line in r.stdout.splitlines())
    assert got[str(allowed_port)] == "PING" and got[str(other_port)].startswith("refused")
    assert killed.exit_code == 137 and killed.signal == 9


def test_the_registry_gives_the_docker_backend_by_name() -> None:
    with LocalSandbox(SandboxLimits(timeout_s=60), backend="docker") as sb:
        root = sb.root
        (root / "work").mkdir()
        r = sb.run(["sh", "-c", "echo $HOME; pwd; echo hi > out"], cwd="work")
        assert (root / "work" / "out").read_text() == "hi\n"  # the private root, at its own path inside
    home, cwd = r.stdout.split()
    assert r.ok and r.isolation == "docker" and home == str(root / "home") and cwd == str(root / "work")


def test_the_disk_quota_counts_the_writable_mounts(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ws.mkdir()
    lim = SandboxLimits(disk_mb=20, disk_poll_s=0.1, timeout_s=120)
    fill = "for i in $(seq 10); do head -c 8000000 /dev/zero > f$i; done; sleep 100"
    with DockerSandbox(lim, mounts=[Mount(ws, "/app", writable=True)]) as sb:
        r = sb.run(["sh", "-c", fill], cwd="/app")
        for f in ws.iterdir():  # what the first run left is over the quota already: the second starts empty
            f.unlink()
        big = sb.run(["sh", "-c", "head -c 30000000 /dev/zero > /app/one"])  # one file past it: RLIMIT_FSIZE
    assert r.disk_exceeded and r.exit_code == 137 and not r.timed_out
    assert big.exit_code != 0 and (ws / "one").stat().st_size <= 20 * 1024 * 1024


_CALLER = """
import sys
from opengyre.sandbox import DockerSandbox, SandboxLimits
with DockerSandbox(SandboxLimits(timeout_s=5), labels={"og.test": sys.argv[1]}) as sb:
    sb.run(["sleep", str(616160 + 1)])  # spelt so that this script's own command line does not hold it
"""


@pytest.mark.slow
def test_a_caller_killed_mid_run_leaves_nothing_running() -> None:
    """A container does not die with its caller: its backstop (the timeout plus a grace, inside) ends the command,
    and the next sandbox opened on this host removes what the dead caller left."""
    tag = os.urandom(6).hex()
    caller = subprocess.Popen([sys.executable, "-c", _CALLER, tag])
    try:
        wait_until(lambda: _host_has("616161"), "the caller's container started its command")
    finally:
        caller.kill()
        caller.wait()
    wait_until(lambda: not _host_has("616161"), "the command outlived its killed caller past the backstop")
    wait_until(
        lambda: (
            subprocess.run(
                ["docker", "ps", "-q", "--filter", f"label=og.test={tag}"], capture_output=True, text=True
            ).stdout
            == ""
        ),
        "the container stopped",
    )
    with DockerSandbox():
        pass
    assert _containers(tag) == []


def test_the_daemons_refusal_is_the_sandboxs_error_and_a_commands_125_is_its_own() -> None:
    with DockerSandbox(cpus=4096) as sb, pytest.raises(SandboxError, match="could not start a container"):
        sb.run(["true"])  # more CPUs than the machine has: the daemon refuses the container (docker's exit 125)
    with DockerSandbox() as sb:
        r = sb.run(["sh", "-c", "exit 125"])
    assert r.exit_code == 125 and not r.timed_out


def test_sandbox_check_reports_the_docker_backend_from_real_runs() -> None:
    ok, lines = check_docker()
    assert ok, lines
    assert "uid inside: 65534" in lines[1] or f"uid inside: {os.getuid()}" in lines[1]
    assert "interfaces: lo (loopback only)" in lines[1] and lines[-1] == "egress bridge: works"


# The command forges the verdict every way it can reach: it writes a success into each status channel it finds
# (a status file, the status socket, by a second connection), then kills its launcher so no true status comes.
_FORGE = """
import glob, os, signal, socket
for path in glob.glob("/run/opengyre-status*"):
    try:
        with open(path, "w") as f:
            f.write("0\\n")
        print("wrote", path)
    except OSError:
        pass
    try:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        s.sendall(b"0\\n")
        s.close()
        print("connected", path)
    except OSError:
        pass
os.kill(os.getppid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("egress", [False, True], ids=["shim", "forwarder"])
def test_a_command_cannot_forge_its_exit_status(egress: bool) -> None:
    """The status comes over a socket the runner accepts once, from the launcher, before the command starts:
    a status the command writes or sends is not believed; killing the launcher is said as a kill."""
    server, port = echo_server()
    try:
        with DockerSandbox(egress=[f"127.0.0.1:{port}"] if egress else []) as sb:
            forged = sb.run(["python3", "-c", _FORGE])
            honest = sb.run(["python3", "-c", "import sys; sys.exit(3)"])
            signalled = sb.run(["sh", "-c", "kill -TERM $$"])
    finally:
        server.close()
    assert not forged.ok and forged.exit_code == 137 and forged.signal == 9, (forged, forged.stdout)
    assert "launcher was killed" in forged.stderr
    assert honest.exit_code == 3 and signalled.exit_code == 143 and signalled.signal == 15


def test_a_shared_memory_budget_is_refused_not_ignored() -> None:
    """A container's memory cgroup is the daemon's: a ``memory_group`` (rollouts sharing a budget) cannot nest it."""
    lim = SandboxLimits(group_memory_mb=64, memory_group="group-1")
    with DockerSandbox() as sb, pytest.raises(SandboxError, match="cannot share a memory budget"):
        sb.run(["true"], limits=lim)
