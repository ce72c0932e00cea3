"""The adversary's corpus against the default (namespace) sandbox: every case is a command trying to reach what
it must not — a task's solution and tests, the proxy's secret, the host's files, processes and network, the
machine's process table and disk — and every case is denied."""

from __future__ import annotations

import errno
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from opengyre.sandbox import LocalSandbox, Mount, SandboxLimits

SECRET = f"og-secret-{uuid.uuid4().hex}"


@pytest.fixture(params=["tmp", "home"])
def data_dir(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Path]:
    """A fake data dir on the host, outside the sandbox: a task's solution and tests, the proxy's secret. Under
    the host's /tmp and under the user's home (the sandbox has a /tmp and a /root of its own)."""
    base = tmp_path if request.param == "tmp" else Path(tempfile.mkdtemp(dir=Path.home(), prefix=".og-adv-"))
    data = base / "data"
    for rel in ("tasks/t1/solution/solve.sh", "tasks/t1/tests/test.sh", "proxy.secret"):
        (data / rel).parent.mkdir(parents=True, exist_ok=True)
        (data / rel).write_text(f"{SECRET}\n")
    try:
        yield data
    finally:
        if request.param == "home":
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "main.py").write_text("print('hello')\n")
    return ws


def _sandbox(workspace: Path, **limits: object) -> LocalSandbox:
    return LocalSandbox(SandboxLimits(timeout_s=60, **limits), mounts=[Mount(workspace, "/app", writable=True)])  # type: ignore[arg-type]


def test_the_default_sandbox_is_the_namespace_one(workspace: Path) -> None:
    with _sandbox(workspace) as sb:
        r = sb.run(["bash", "-c", "id -u; cat /app/main.py"], cwd="/app")
    assert r.ok and r.isolation == "namespace" and r.network_isolated
    assert r.stdout.split("\n")[:2] == ["1000", "print('hello')"]


def _reads(data: Path) -> list[str]:
    files = [data / "tasks/t1/solution/solve.sh", data / "tasks/t1/tests/test.sh", data / "proxy.secret"]
    ups = "../" * 12
    out = []
    for f in files:
        out += [
            f"cat {f}",
            f"cd /app && cat {ups}{str(f).lstrip('/')}",
            f"cat /proc/self/root{f}",
            f"cat /proc/1/root{f}",
        ]
    # A search of everything but the system's directories (read-only copies of the host's own: no data there).
    prune = "\\( -path /usr -o -path /proc -o -path /sys -o -path /dev \\) -prune -o"
    out += [f"ls -la {data}", f"find / {prune} -name proxy.secret -print 2>/dev/null | xargs -r cat"]
    out += [f"grep -rs og-secret- /etc /home /root /run /tmp /app {Path.home()} 2>/dev/null | head -1"]
    return out


def test_no_file_of_the_data_dir_can_be_read(workspace: Path, data_dir: Path) -> None:
    with _sandbox(workspace) as sb:
        results = [(cmd, sb.run(["bash", "-c", cmd], cwd="/app")) for cmd in _reads(data_dir)]
    assert len(results) == 15
    leaked = [cmd for cmd, r in results if SECRET in r.output]
    assert not leaked, f"read the secret: {leaked}"
    # The plain reads failed because the files are not there, not for want of a shell.
    assert all(r.exit_code != 0 for cmd, r in results if cmd.startswith(("cat", "cd", "ls")))


def test_nothing_outside_the_workspace_and_the_private_dirs_can_be_written(workspace: Path) -> None:
    host_tmp = Path("/tmp") / f"og-adv-{uuid.uuid4().hex}"
    venv = Path(sys.prefix)
    targets = [str(host_tmp), f"{venv}/og-adv-pwned", f"{sys.base_prefix}/og-adv-pwned", "/usr/og-adv-pwned"]
    targets += ["/etc/og-adv-pwned", "/etc/passwd", "/bin/og-adv-pwned"]
    with _sandbox(workspace) as sb:
        results = {t: sb.run(["bash", "-c", f"echo pwned > {t}"]) for t in targets}
        # Elsewhere in the sandbox's own root (a tmpfs of bwrap's): read-only, it cannot take memory either.
        spots = {d: sb.run(["bash", "-c", f"echo pwned > {d}/og-adv"]) for d in ("/", "/home", "/run", "/root")}
        own = sb.run(["bash", "-c", "echo mine > /app/mine; echo mine > /tmp/mine; echo mine > $HOME/mine"])
    assert own.ok and (workspace / "mine").read_text() == "mine\n"
    # The host's /tmp is not the sandbox's: a write there lands in its private tmpfs, never on the host.
    assert {t: r.exit_code for t, r in results.items() if r.ok} == {str(host_tmp): 0}
    assert {d: r.exit_code for d, r in spots.items() if r.ok} == {}
    assert not host_tmp.exists() and not (venv / "og-adv-pwned").exists() and not Path("/usr/og-adv-pwned").exists()
    assert "pwned" not in Path("/etc/passwd").read_text()


def test_host_processes_can_be_neither_seen_nor_signalled(workspace: Path) -> None:
    victim = subprocess.Popen(["sleep", "300"])
    try:
        with _sandbox(workspace) as sb:
            ps = sb.run(["bash", "-c", "ps -e --no-headers | wc -l; ls /proc | grep -c '^[0-9]'"])
            kill = sb.run(["bash", "-c", f"kill -9 {victim.pid}"])
            seen = sb.run(["bash", "-c", f"test -e /proc/{victim.pid} && echo visible || echo absent"])
        assert ps.ok and all(int(n) < 10 for n in ps.stdout.split()), ps.stdout  # its own few, not the host's
        assert kill.exit_code != 0 and victim.poll() is None  # the host's sleep lives on
        assert seen.stdout.strip() == "absent"
    finally:
        victim.kill()
        victim.wait()


CONNECT = """
import errno, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
s.settimeout(5)
try:
    s.connect((host, port))
    print("connected")
except OSError as exc:
    print(errno.errorcode.get(exc.errno, exc.errno))
"""


def test_no_host_port_and_no_other_address_can_be_reached(workspace: Path) -> None:
    """A listener of the test's own on the host's loopback (standing for NATS, gRPC, an engine, PostgreSQL), the
    machine's real PostgreSQL and NATS ports, and a non-loopback address: the last has no route at all in the
    sandbox's network namespace (only its loopback), so nothing is sent anywhere."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    try:
        with _sandbox(workspace) as sb:
            local = {p: sb.run([sys.executable, "-c", CONNECT, "127.0.0.1", str(p)]) for p in (port, 5432, 4222)}
            remote = sb.run([sys.executable, "-c", CONNECT, "10.255.255.1", "80"])
            ipv6 = sb.run([sys.executable, "-c", CONNECT, "::1", str(port)])
    finally:
        listener.close()
    assert {p: r.stdout.strip() for p, r in local.items()} == {p: "ECONNREFUSED" for p in (port, 5432, 4222)}
    assert remote.stdout.strip() == errno.errorcode[errno.ENETUNREACH]
    assert ipv6.stdout.strip() in ("ECONNREFUSED", "EADDRNOTAVAIL", "ENETUNREACH")


FORK_BOMB = """
import subprocess
started = []
try:
    for _ in range(2000):
        started.append(subprocess.Popen(["sleep", "100"]))
except OSError as exc:
    print(len(started), exc.errno)
else:
    print(len(started), 0)
"""


def test_a_fork_bomb_ends_within_max_processes(workspace: Path) -> None:
    with _sandbox(workspace, max_processes=64) as sb:
        r = sb.run([sys.executable, "-c", FORK_BOMB])
        # The shell's own: bash retries a failing fork a few times, then gives up the whole script.
        bash = sb.run(["bash", "-c", "for i in $(seq 2000); do sleep 100 & done; echo survived"])
    started, err = (int(x) for x in r.stdout.split())
    assert r.ok and not r.timed_out and err == errno.EAGAIN and started < 64, r.output
    assert not bash.timed_out and bash.exit_code != 0 and "survived" not in bash.stdout
    assert "fork" in bash.stderr and "Resource temporarily unavailable" in bash.stderr


def test_a_disk_filler_is_stopped_at_the_quota(workspace: Path) -> None:
    with _sandbox(workspace, disk_mb=64) as sb:
        big = sb.run(["bash", "-c", "fallocate -l 2G /app/big || exit 7; echo allocated"])
        tmp = sb.run(["bash", "-c", "fallocate -l 2G /tmp/big || exit 7; echo allocated"])
        loop = sb.run(["bash", "-c", "i=0; while :; do head -c 1048576 /dev/zero > /app/f$i; i=$((i+1)); done"])
    assert big.exit_code != 0 and "allocated" not in big.stdout  # one file past RLIMIT_FSIZE
    assert tmp.exit_code != 0 and "allocated" not in tmp.stdout  # the private /tmp is a sized tmpfs
    assert loop.disk_exceeded and loop.exit_code == 137 and not loop.timed_out and "disk quota" in loop.stderr
    written = sum(f.stat().st_blocks * 512 for f in workspace.glob("f*"))
    assert 64 << 20 < written < 1 << 30  # stopped past the quota, long before the disk


def test_an_inode_filler_is_stopped_at_the_quota(workspace: Path) -> None:
    # Empty files allocate no block: uncounted, a command could take the host's inodes (the data dir's file
    # system) a million at a time within any quota. Each costs the quota at least a block.
    fill = (
        "import os\nfor i in range(1_000_000): os.close(os.open(f'/app/e{i}', os.O_CREAT | os.O_WRONLY))\nprint('made')"
    )
    with _sandbox(workspace, disk_mb=16) as sb:
        r = sb.run(["python3", "-c", fill])
    assert r.disk_exceeded and r.exit_code == 137 and "made" not in r.stdout, (r.exit_code, r.stderr)
    assert 16 << 20 < 4096 * len(list(workspace.glob("e*"))) < 1 << 30  # stopped past the quota, long before


_HIDE = """
import json, sys
from pathlib import Path
from opengyre.sandbox import LocalSandbox, Mount, SandboxLimits
hide = (
    "mkdir -p /app/a/b && chmod 300 /app/a/b && for i in $(seq 64); do head -c 1048576 /dev/zero > /app/a/b/f$i; "
    "done; chmod 100 /app/a; echo hidden"
)
with LocalSandbox(SandboxLimits(timeout_s=60, disk_mb=16), mounts=[Mount(Path(sys.argv[1]), "/app", True)]) as sb:
    r = sb.run(["bash", "-c", hide])
print(json.dumps([r.exit_code, r.disk_exceeded, r.stdout]))
"""


def test_a_directory_the_command_makes_unreadable_to_its_owner_still_counts_towards_the_quota(
    workspace: Path,
) -> None:
    # The sandbox's user is mapped onto the caller's, so the command owns its directories and may make them
    # unreadable (``chmod 300``: it still writes there). A stack of an ordinary user has no DAC override, so its
    # watcher could not list them: 64 MiB under a 16 MiB quota went uncounted. As root, drop the override.
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    run = subprocess.run(
        [*drop, sys.executable, "-c", _HIDE, str(workspace)], capture_output=True, text=True, check=False
    )
    assert run.returncode == 0, run.stderr
    exit_code, disk_exceeded, out = json.loads(run.stdout.splitlines()[-1])
    # Counted: by a poll while it wrote, or by the last look when it ended (then it printed "hidden" first).
    assert disk_exceeded and exit_code == 137, (exit_code, out, run.stderr[-500:])
    assert stat.S_IMODE((workspace / "a" / "b").stat().st_mode) == 0o300  # its mode given back after each walk


_LEAVE = """
import json
from opengyre.sandbox import LocalSandbox, SandboxLimits
with LocalSandbox(SandboxLimits(timeout_s=60)) as sb:
    base = sb.root.parent
    leave = "mkdir -p $SANDBOX_ROOT/tmp/h/d && head -c 8388608 /dev/zero > $SANDBOX_ROOT/tmp/h/d/f && chmod 000 $SANDBOX_ROOT/tmp/h"
    r = sb.run(["bash", "-c", leave + " && mkdir $HOME/ro && touch $HOME/ro/f && chmod 500 $HOME/ro"])
print(json.dumps([r.exit_code, base.exists(), str(base)]))
"""


def test_what_the_command_made_unreadable_is_removed_with_its_sandbox() -> None:
    # Without root's DAC override (a stack of an ordinary user) `rmtree` could not enter a directory the command
    # made `chmod 000`, nor empty one it made read-only, and left them behind: its quota's bytes on the host's disk
    # for good, every sandbox. As root, drop the override.
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    run = subprocess.run([*drop, sys.executable, "-c", _LEAVE], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    exit_code, left, base = json.loads(run.stdout.splitlines()[-1])
    try:
        assert exit_code == 0 and not left, (exit_code, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_command_nested_in_a_namespace_sandbox_runs_in_the_process_backend_inside_it(
    workspace: Path, data_dir: Path
) -> None:
    """bwrap cannot nest (no /proc mount inside): a sandbox opened inside one of ours is the process backend,
    explicitly (``isolation == "nested"``), and the outer isolation still holds for what it runs."""
    code = (
        "from opengyre.sandbox import LocalSandbox; "
        "sb = LocalSandbox().open(); "
        f"r = sb.run(['bash', '-c', 'cat {data_dir / 'proxy.secret'} || echo denied; id -u']); "
        "print(r.isolation, r.stdout.strip())"
    )
    with _sandbox(workspace) as sb:
        r = sb.run([sys.executable, "-c", code])
    assert r.ok, r.stderr
    assert r.stdout.split() == ["nested", "denied", "1000"] and SECRET not in r.output


def test_another_sandbox_and_another_workspace_are_out_of_reach(workspace: Path, tmp_path: Path) -> None:
    other_ws = tmp_path / "other-ws"
    other_ws.mkdir()
    (other_ws / "answer.txt").write_text(SECRET)
    with _sandbox(workspace) as mine, LocalSandbox(mounts=[Mount(other_ws, "/app", writable=True)]) as theirs:
        (theirs.root / "home" / "notes").write_text(SECRET)
        paths = [theirs.root / "home" / "notes", other_ws / "answer.txt", theirs.root]
        results = [mine.run(["bash", "-c", f"cat {p} || ls {p}"]) for p in paths]
        own = theirs.run(["cat", "/app/answer.txt"])
    assert own.ok and own.stdout == SECRET  # it is there, for its own sandbox
    assert all(r.exit_code != 0 and SECRET not in r.output for r in results), [r.output for r in results]


def test_a_python_install_under_the_hosts_tmp_is_visible_under_the_private_tmp() -> None:
    """A checkout (its venv) under the host's /tmp, as CI's clean clone may be: the sandbox's private /tmp is
    mounted first and the Python install bound over it, so the interpreter is still there inside."""
    base = Path(tempfile.mkdtemp(dir="/tmp", prefix="og-venv-"))  # under the host's /tmp whatever TMPDIR says
    try:
        _python_install_under(base / "venv")
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _python_install_under(venv: Path) -> None:
    import site
    import sysconfig

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # The new venv reaches this one's packages and source roots through a .pth, as an editable install does.
    ours = [p for p in (*site.getsitepackages(), *sys.path) if p.startswith("/") and Path(p).is_dir()]
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(venv), "platbase": str(venv)}))
    (purelib / "_og_test.pth").write_text("\n".join(dict.fromkeys(ours)) + "\n")
    code = (
        "import sys; from opengyre.sandbox import LocalSandbox\n"
        "with LocalSandbox() as sb:\n"
        "    r = sb.run([sys.executable, '-c', 'import sys, opengyre.sandbox; print(sys.prefix)'])\n"
        "print(r.exit_code, r.isolation, r.stdout.strip(), r.stderr.strip()[-300:])\n"
    )
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split()[:3] == ["0", "namespace", str(venv)], out.stdout + out.stderr


# -- what the command's own processes could take from the sandbox's processes ----------------------------------

FORGE = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
me, got = os.getpid(), []
for pid in (p for p in os.listdir("/proc") if p.isdigit() and int(p) != me):
    if pid == "1":  # bwrap's init: no capability, no descriptor but 0-2 (below); a stopped one hangs only this sandbox
        continue
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        fds = []
    for fd in fds:  # a pipe another process holds, reopened for writing: the status pipe would take "9"
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("pipe:") and fd not in ("0", "1", "2"):
                w = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
                os.write(w, b"9\n")
                os.close(w)
                got.append(f"pipe {pid}/{fd}")
        except OSError:
            pass
    if libc.ptrace(16, int(pid), None, None) == 0:  # PTRACE_ATTACH
        got.append(f"ptrace {pid}")
        libc.ptrace(17, int(pid), None, None)  # PTRACE_DETACH
    try:
        os.close(os.open(f"/proc/{pid}/mem", os.O_RDWR))
        got.append(f"mem {pid}")
    except OSError:
        pass
init = open("/proc/1/status").read()
if "CapEff:\t0000000000000000" not in init or "NoNewPrivs:\t1" not in init:
    got.append("init privileged")
print(" ".join(got) or "none")
sys.exit(3)
"""


@pytest.mark.parametrize("launcher", ["perl shim", "egress forwarder"])
def test_the_sandboxs_own_processes_are_out_of_the_commands_reach(workspace: Path, launcher: str) -> None:
    """The command shares its user and pid namespace with the sandbox's launcher, which holds the pipe where it
    reports the command's wait status: a "9" written there first would read as a SIGKILL from outside (the OOM
    killer's: masked as infrastructure). Neither its descriptors, its memory nor ptrace are the command's."""
    egress = []
    listener = socket.socket()
    if launcher == "egress forwarder":
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        egress = [f"127.0.0.1:{listener.getsockname()[1]}"]
    try:
        with LocalSandbox(SandboxLimits(timeout_s=60), mounts=[Mount(workspace, "/app")], egress=egress) as sb:
            r = sb.run([sys.executable, "-c", FORGE])
    finally:
        listener.close()
    assert (r.exit_code, r.signal, r.stdout.strip()) == (3, None, "none"), r.output


def test_a_launcher_killed_from_inside_is_a_sigkill_and_the_kernel_counted_no_oom(workspace: Path) -> None:
    """Only a SIGKILL ends the launcher (the other signals are ignored): the command's own processes can send
    it, and then the status never comes. That is said as a SIGKILL, not as exit code 137 of the command, and
    ``oom_kills`` (the kernel's count meanwhile) says it was not the OOM killer."""
    with _sandbox(workspace) as sb:
        term = sb.run(["bash", "-c", "for s in TERM INT HUP QUIT USR1 ALRM; do kill -$s $PPID; done; exit 5"])
        kill = sb.run(["bash", "-c", "kill -KILL $PPID; sleep 30"])
    assert (term.exit_code, term.signal) == (5, None), term.output
    assert (kill.exit_code, kill.signal, kill.timed_out) == (137, 9, False), kill.output
    assert kill.oom_kills == 0 and "launcher was killed" in kill.stderr


def test_no_descriptor_and_no_secret_of_the_service_reaches_the_command(
    workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service's open files (its SQLite database, a NATS socket, a pipe), even where inheritable, and its
    secrets in the environment (the gRPC token, the NATS password) are not the command's."""
    for key in ("OPENGYRE_GRPC_TOKEN", "OPENGYRE_NATS_PASSWORD", "OPENGYRE_NATS_USER", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(key, SECRET)
    db = open(tmp_path / "trainer.db", "w+b")  # noqa: SIM115
    db.write(SECRET.encode())
    db.flush()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    conn = socket.create_connection(listener.getsockname())
    r_pipe, w_pipe = os.pipe()
    for fd in (db.fileno(), listener.fileno(), conn.fileno(), r_pipe, w_pipe):
        os.set_inheritable(fd, True)
    try:
        with _sandbox(workspace) as sb:
            fds = sb.run(["bash", "-c", "ls /proc/self/fd; cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n'"])
            env = sb.run(["env"])
    finally:
        for f in (db, conn, listener):
            f.close()
        os.close(r_pipe)
        os.close(w_pipe)
    numbers = sorted(int(x) for x in fds.stdout.split() if x.isdigit())
    assert numbers == [0, 1, 2, 3], fds.stdout  # 3: ls's own directory
    assert SECRET not in fds.stdout and SECRET not in env.stdout
    assert not any(k.startswith(("OPENGYRE_GRPC", "OPENGYRE_NATS")) for k in env.stdout.split()), env.stdout


KERNEL = r"""
import errno, fcntl, os, socket, termios
out = []
for fd in (0, 1, 2):  # TIOCSTI: type into the host's terminal
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
        out.append(f"tiocsti {fd}")
    except OSError:
        pass
try:
    os.close(os.open("/dev/tty", os.O_RDWR))
    out.append("tty")
except OSError:
    pass
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(b"\0" + os.environ["ABSTRACT"].encode())  # the host's abstract socket
    out.append("abstract")
except OSError:
    pass
for path in ("/sys/fs/cgroup", "/sys/kernel", "/dev/shm/" + os.environ["SHM"], "/run/user", "/var/run"):
    if os.path.exists(path):
        out.append(path)
# Opened for writing, never written: the permission is checked at open (a write to core_pattern or modprobe
# would run a program of the command's as the host's root; sysrq-trigger reboots the machine).
for path in ("/proc/sys/kernel/core_pattern", "/proc/sys/kernel/modprobe", "/proc/sys/vm/drop_caches",
             "/proc/sys/kernel/hostname", "/proc/sysrq-trigger"):
    try:
        os.close(os.open(path, os.O_WRONLY))
        out.append("writable " + path)
    except OSError:
        pass
for path in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/kallsyms"):
    try:
        with open(path, "rb") as f:
            if f.read(1):
                out.append("readable " + path)
    except OSError:
        pass
print(" ".join(out) or "none")
"""


def test_the_hosts_kernel_objects_are_not_the_commands(workspace: Path) -> None:
    """The host's terminal (TIOCSTI), its abstract Unix sockets, /sys and the cgroup files, /dev/shm and /run,
    SysV message queues and /proc/sys: none reachable, none writable."""
    name = f"og-adv-{uuid.uuid4().hex}"
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind(b"\0" + name.encode())
    abstract.listen(1)
    shm = Path("/dev/shm") / name
    shm.write_text(SECRET)
    queue = subprocess.run(["ipcmk", "-Q"], capture_output=True, text=True, check=True).stdout.split()[-1]
    try:
        with _sandbox(workspace) as sb:
            r = sb.run([sys.executable, "-c", KERNEL], env={"ABSTRACT": name, "SHM": name})
            ipcs = sb.run(["bash", "-c", "ipcs -q"])
    finally:
        abstract.close()
        shm.unlink()
        subprocess.run(["ipcrm", "-q", queue], check=False)
    assert r.ok and r.stdout.strip() == "none", r.output
    assert ipcs.ok and queue not in ipcs.stdout, ipcs.stdout


def test_mounts_of_the_commands_own_namespaces_reveal_nothing_of_the_host(workspace: Path, data_dir: Path) -> None:
    """A user namespace of its own gives the command the capabilities to mount in a mount namespace of its own:
    the host's files under the sandbox's mounts stay out of reach and the read-only ones stay read-only."""
    secret = data_dir / "proxy.secret"
    script = (
        "unshare -rm bash -c '"
        "umount -l /tmp; umount -l /home/agent; umount -l /app; umount -l /etc; "
        "mount -o remount,rw /usr 2>/dev/null && touch /usr/og-adv && echo rw-usr; "
        "mount -t proc proc /proc 2>/dev/null && echo proc; mount -t sysfs sys /sys 2>/dev/null && echo sysfs; "
        f"cat {secret} /proc/1/root{secret} 2>/dev/null; "
        "grep -rs og-secret- / --exclude-dir=proc --exclude-dir=usr --exclude-dir=sys 2>/dev/null | head -1; true'"
    )
    with _sandbox(workspace) as sb:
        r = sb.run(["bash", "-c", script])
    assert SECRET not in r.output and not Path("/usr/og-adv").exists()
    assert not {"rw-usr", "proc", "sysfs"} & set(r.stdout.split()), r.output


def test_nothing_the_command_started_outlives_it(workspace: Path) -> None:
    """A daemon that left the command's session (``setsid``) or was double-forked is dead when ``run`` returns:
    nothing of the agent's is left to race the grader's copy of the workspace."""
    token = uuid.uuid4().hex
    daemon = f"exec -a og-stray-{token} bash -c 'while :; do echo x >> /app/spam; done'"
    script = f'setsid bash -c "{daemon}" </dev/null >/dev/null 2>&1 & ( ( {daemon} ) & ) ; exit 0'
    with _sandbox(workspace) as sb:
        r = sb.run(["bash", "-c", script])
        alive = []
        for pid in (p for p in os.listdir("/proc") if p.isdigit()):
            try:
                if token.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                    alive.append(pid)
            except OSError:
                continue
    assert r.ok and alive == [], (r.output, alive)


def test_writing_past_the_quota_and_ending_before_the_next_poll_is_counted(workspace: Path) -> None:
    # The quota is polled; a command that writes past it and ends between two polls (here: no poll comes within
    # the command's life) is counted by the look at its end, not let through.
    limits = SandboxLimits(timeout_s=60, disk_mb=4, disk_poll_s=600)
    with LocalSandbox(limits, mounts=[Mount(workspace, "/app", True)]) as sb:
        r = sb.run(["bash", "-c", "for i in 1 2 3 4 5 6; do head -c 1048576 /dev/zero > /app/f$i; done; echo done"])
    assert r.disk_exceeded and r.exit_code == 137 and "done" in r.stdout, r
