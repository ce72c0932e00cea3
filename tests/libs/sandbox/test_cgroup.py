"""The command's own memory cgroup: its OOM kills counted apart from the machine's, and ``group_memory_mb`` as the
kernel's limit on it, with real OOM kills (a memory cgroup of the test's own stands for the rest of the machine).

Skipped, with the reason, where this process cannot make memory cgroups (then ``oom_kills`` is the machine's and
``oom_kills_scope`` says so)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from opengyre.sandbox import LocalSandbox, Mount, SandboxLimits, SandboxResult
from opengyre.sandbox._base import oom_kill_count
from opengyre.sandbox._cgroup import memory_cgroup_parent, pids_cgroup_parent

from ..._polling import wait_until

pytestmark = pytest.mark.skipif(
    memory_cgroup_parent() is None or pids_cgroup_parent() is None,
    reason="no memory and pids cgroups can be made here: oom_kills is the machine's (oom_kills_scope 'machine')",
)

_HOG = "x = b'x' * (256 << 20); print('held')"  # touched pages, not a lazily zeroed calloc


def _oom_kill_elsewhere() -> None:
    """A real OOM kill outside the sandbox: a process in a 32 MiB memory cgroup of the test's own takes 256."""
    parent = memory_cgroup_parent()
    assert parent is not None
    cg = parent / f"opengyre-test-elsewhere-{uuid.uuid4().hex[:8]}"
    cg.mkdir()
    try:
        limit = cg / "memory.max"
        if limit.exists():
            limit.write_text(str(32 << 20))
        else:
            (cg / "memory.limit_in_bytes").write_text(str(32 << 20))
            if (cg / "memory.memsw.limit_in_bytes").exists():
                (cg / "memory.memsw.limit_in_bytes").write_text(str(32 << 20))
        enter = ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cg / "cgroup.procs")]
        hog = subprocess.run([*enter, sys.executable, "-c", _HOG], capture_output=True, check=False)
        assert hog.returncode == -9, hog  # the kernel's OOM killer, in that cgroup
    finally:
        cg.rmdir()


def test_an_oom_kill_elsewhere_is_not_the_commands(tmp_path: Path) -> None:
    """The command SIGKILLs itself while the kernel OOM-kills a process elsewhere: the machine counted one, the
    command's own cgroup none, so its SIGKILL is not read as the OOM killer's."""
    ws = tmp_path / "ws"
    ws.mkdir()
    wait_for_go = "touch /app/started; while [ ! -e /app/go ]; do sleep 0.02; done; kill -KILL $$"
    got: list[SandboxResult] = []
    with LocalSandbox(SandboxLimits(timeout_s=120), mounts=[Mount(ws, "/app", writable=True)]) as sb:
        t = threading.Thread(target=lambda: got.append(sb.run(["bash", "-c", wait_for_go])))
        t.start()
        try:
            wait_until(lambda: (ws / "started").exists(), "the command started")
            before = oom_kill_count()
            _oom_kill_elsewhere()
            after = oom_kill_count()
        finally:
            (ws / "go").touch()
            t.join()
    assert before is not None and after is not None and after > before  # the machine counted it
    r = got[0]
    assert (r.exit_code, r.signal, r.oom_kills, r.oom_kills_scope) == (137, 9, 0, "cgroup"), r


def test_group_memory_mb_is_the_kernels_limit_on_the_commands_cgroup(tmp_path: Path) -> None:
    """cgroup v2 (``memory.oom.group``: an OOM kill takes the whole command): with the poller out of the way (an
    hour between polls), the kernel's limit alone stops the command, an OOM kill in its own cgroup said as
    ``memory_exceeded``. cgroup v1 kills one process and lets the rest go on, so there the sandbox's watcher (which
    kills the whole tree) is the command's limit and no kernel limit is set on the command's cgroup."""
    v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
    lim = SandboxLimits(timeout_s=120, memory_mb=None, group_memory_mb=64, memory_poll_s=3600 if v2 else 0.05)
    with LocalSandbox(lim) as sb:
        r = sb.run([sys.executable, "-c", _HOG])
        ok = sb.run([sys.executable, "-c", "x = b'x' * (16 << 20); print('held')"])
    assert r.memory_exceeded and r.exit_code == 137 and "held" not in r.stdout, r
    if v2:
        assert r.oom_kills is not None and r.oom_kills >= 1 and r.oom_kills_scope == "cgroup"
    assert ok.ok and ok.stdout.strip() == "held" and ok.oom_kills == 0


def _hold(ws: Path, name: str, mb: int) -> str:
    """A command that holds ``mb`` MiB (touched), says so in ``ws``, and lets go once ``ws/go`` exists."""
    return (
        f"import os, pathlib, time\nx = b'x' * ({mb} << 20)\npathlib.Path('/app/{name}').touch()\n"
        "while not os.path.exists('/app/go'):\n    time.sleep(0.02)\nprint('held')\n"
    )


def _two_holding(tmp_path: Path, groups: tuple[str | None, str | None], mb: int = 64) -> list[SandboxResult]:
    """Two sandboxes, each a command holding ``mb`` MiB at once, under a 96 MiB ``group_memory_mb`` each."""
    ws = tmp_path / "ws"
    ws.mkdir(parents=True)
    got: dict[str, SandboxResult] = {}
    threads = []
    for name, group in zip(("a", "b"), groups, strict=True):
        lim = SandboxLimits(timeout_s=120, memory_mb=None, group_memory_mb=96, memory_poll_s=3600, memory_group=group)

        def run(name: str = name, lim: SandboxLimits = lim) -> None:
            with LocalSandbox(lim, mounts=[Mount(ws, "/app", writable=True)]) as sb:
                got[name] = sb.run([sys.executable, "-c", _hold(ws, name, mb)])

        threads.append(threading.Thread(target=run))
    try:
        threads[0].start()
        wait_until(lambda: (ws / "a").exists() or "a" in got, "the first command holds its memory")
        threads[1].start()
        wait_until(lambda: (ws / "b").exists() or "b" in got or "a" in got, "the second command holds or ended")
    finally:
        (ws / "go").touch()
        for t in threads:
            t.join()
    return [got["a"], got["b"]]


def test_the_rollouts_of_one_group_share_one_memory_budget(tmp_path: Path) -> None:
    """Two commands of 64 MiB each: apart (each its own 96 MiB budget) both hold; in one group (a 96 MiB budget
    they share, the kernel's limit on their group's cgroup) one of them is OOM-killed, and said so."""
    apart = _two_holding(tmp_path / "apart", (None, None))
    shared = _two_holding(tmp_path / "shared", ("group-1", "group-1"))
    assert all(r.ok and r.stdout.strip() == "held" for r in apart), apart
    killed = [r for r in shared if r.memory_exceeded]
    assert len(killed) >= 1 and all(r.exit_code == 137 and r.oom_kills_scope == "cgroup" for r in killed), shared
    parent = memory_cgroup_parent()
    assert parent is not None and not list(parent.glob(f"opengyre-group-{os.getpid()}-*"))  # removed with the last


_NESTED = """
from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits
lim = SandboxLimits(timeout_s=30, group_memory_mb=64, memory_group="group-1")
try:
    with LocalSandbox(lim) as sb:
        sb.run(["true"])
    print("ran")
except SandboxError as exc:
    print("refused:", exc)
"""


def test_a_shared_budget_is_refused_where_no_cgroup_can_be_made() -> None:
    """Inside the namespace sandbox no cgroup can be made (no /sys): a sandbox opened there with a shared budget
    refuses to run, naming why and how to turn the budget off, instead of running without it."""
    with LocalSandbox(SandboxLimits(timeout_s=120)) as outer:
        r = outer.run([sys.executable, "-c", _NESTED])
    assert r.ok, r.stderr
    assert r.stdout.startswith("refused:") and "memory_group" in r.stdout and "group_memory_mb = 0" in r.stdout
