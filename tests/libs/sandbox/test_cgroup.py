"""The command's own memory cgroup: its OOM kills counted apart from the machine's, and ``group_memory_mb`` as the
kernel's limit on it, with real OOM kills (a memory cgroup of the test's own stands for the rest of the machine).

Skipped, with the reason, where this process cannot make memory cgroups (then ``oom_kills`` is the machine's and
``oom_kills_scope`` says so)."""

from __future__ import annotations

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
    """With the poller out of the way (an hour between polls), the kernel's limit alone stops the command: an OOM
    kill in its own cgroup, said as ``memory_exceeded``."""
    lim = SandboxLimits(timeout_s=120, memory_mb=None, group_memory_mb=64, memory_poll_s=3600)
    with LocalSandbox(lim) as sb:
        r = sb.run([sys.executable, "-c", _HOG])
        ok = sb.run([sys.executable, "-c", "x = b'x' * (16 << 20); print('held')"])
    assert r.memory_exceeded and r.exit_code == 137 and "held" not in r.stdout, r
    assert r.oom_kills is not None and r.oom_kills >= 1 and r.oom_kills_scope == "cgroup"
    assert ok.ok and ok.stdout.strip() == "held" and ok.oom_kills == 0
