"""The grader runs after the agent, apart from it: a workspace that plants symlinks, FIFOs, sockets, devices,
setuid files, hard links to outside files or a huge sparse file makes the grader read nothing outside it, hang or
fill the disk; and what the grader writes is read back from the host only as a bounded regular file."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from opengyre.grading import CopyBounds, HarborVerifier, RewardFileError, copy_workspace, read_reward
from opengyre.sandbox import SandboxLimits

# The agent's answer is the first line of /app/out.txt: 1 is what the grader gives for a right one.
GRADE_OUT = """#!/bin/bash
if [ "$(head -c 64 /app/out.txt 2>/dev/null)" = "$(cat /tests/expected.txt)" ]; then r=1; else r=0; fi
echo $r > /logs/verifier/reward.txt
"""


def make_task(root: Path, test_sh: str = GRADE_OUT) -> Path:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "tests" / "expected.txt").write_text("the-answer-7f3a\n")
    return task


def make_ws(root: Path) -> Path:
    ws = root / "ws"
    ws.mkdir()
    return ws


def test_an_honest_answer_scores_one_so_the_attacks_below_can_fail(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    (ws / "out.txt").write_text("the-answer-7f3a\n")
    ev = HarborVerifier().evaluate(make_task(tmp_path), ws)
    assert (ev.score, ev.failure_class) == (1.0, None), ev.detail


def test_the_grader_sees_real_paths_and_nothing_of_the_host(tmp_path: Path) -> None:
    host_secret = tmp_path / "host-secret.txt"
    host_secret.write_text("secret\n")
    sh = (
        "#!/bin/bash\nr=1\n"
        '[ "$PWD" = /app ] || r=0\n'
        f"[ -e {host_secret} ] && r=0\n"  # the host's files, the task's directory: not there
        f"[ -e {tmp_path / 'task'} ] && r=0\n"
        "echo x > /tests/expected.txt 2>/dev/null && r=0\n"  # the tests are read-only
        "[ -d /logs/agent ] && [ -w /logs/verifier ] || r=0\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    ev = HarborVerifier().evaluate(make_task(tmp_path, sh), make_ws(tmp_path))
    assert ev.score == 1.0, ev.detail


def test_a_symlink_to_the_answer_key_or_a_host_file_reads_nothing(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    host_copy = tmp_path / "leaked.txt"
    host_copy.write_text("the-answer-7f3a\n")  # the answer, somewhere on the host the grader must not reach
    for target in (
        "/tests/expected.txt",
        "../tests/expected.txt",
        "/proc/self/root/tests/expected.txt",
        "/proc/1/cwd/../tests/expected.txt",
        str(host_copy),
        str(task / "tests" / "expected.txt"),
    ):
        ws = tmp_path / f"ws-{abs(hash(target))}"
        ws.mkdir()
        (ws / "out.txt").symlink_to(target)
        ev = HarborVerifier().evaluate(task, ws)
        assert ev.score == 0.0, (target, ev)


def test_a_chain_of_symlinks_into_the_tests_is_cut(tmp_path: Path) -> None:
    task = make_task(tmp_path)
    ws = make_ws(tmp_path)
    (ws / "root").symlink_to("/")  # harmless itself (the system is read-only), a step towards /tests
    (ws / "d").mkdir()
    (ws / "d" / "up").symlink_to("../root/usr")  # -> /usr
    (ws / "out.txt").symlink_to("d/up/../tests/expected.txt")  # /usr/.. is /: -> /tests/expected.txt
    report = copy_workspace(ws, tmp_path / "copy")
    assert [s.split(" ")[0] for s in report.skipped] == ["out.txt"]
    assert HarborVerifier().evaluate(task, ws).score == 0.0


def test_symlinks_inside_the_workspace_and_to_the_system_stay_symlinks(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    (ws / "real.txt").write_text("the-answer-7f3a\n")
    (ws / "out.txt").symlink_to("real.txt")
    (ws / "py").symlink_to("/usr/bin/env")
    (ws / "dangling").symlink_to("/nowhere/at/all")
    sh = (
        GRADE_OUT
        + '[ -L /app/py ] && [ "$(readlink /app/dangling)" = /nowhere/at/all ] || echo 0 > /logs/verifier/reward.txt\n'
    )
    ev = HarborVerifier().evaluate(make_task(tmp_path, sh), ws)
    assert ev.score == 1.0, ev.detail


def test_a_hard_link_to_a_file_outside_the_workspace_is_left_out(tmp_path: Path) -> None:
    outside = tmp_path / "answer-elsewhere.txt"
    outside.write_text("the-answer-7f3a\n")
    ws = make_ws(tmp_path)
    os.link(outside, ws / "out.txt")
    ev = HarborVerifier().evaluate(make_task(tmp_path), ws)
    assert ev.score == 0.0 and "hard link" in ev.detail, ev
    # Two names for one file, both inside: an ordinary workspace, copied.
    ws2 = tmp_path / "ws2"
    ws2.mkdir()
    (ws2 / "out.txt").write_text("the-answer-7f3a\n")
    os.link(ws2 / "out.txt", ws2 / "also.txt")
    assert HarborVerifier().evaluate(make_task(tmp_path / "b"), ws2).score == 1.0


def test_fifos_sockets_and_devices_are_left_out_and_block_nothing(tmp_path: Path) -> None:
    import socket

    ws = make_ws(tmp_path)
    os.mkfifo(ws / "out.txt")  # a grader reading it would wait for a writer forever
    os.mkfifo(ws / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ws / "live.sock"))
    server.listen()
    devices = []
    try:
        os.mknod(ws / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        devices.append("zero")
    except PermissionError:
        pass  # no CAP_MKNOD here: the FIFOs and the socket are still checked (said in the assertion below)
    sh = (
        "#!/bin/bash\nr=1\n"
        "for f in out.txt fifo live.sock zero; do [ -e /app/$f ] && r=0; done\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    try:
        ev = HarborVerifier().evaluate(make_task(tmp_path, sh), ws)
    finally:
        server.close()
    assert ev.score == 1.0, ev.detail
    skipped = {"out.txt", "fifo", "live.sock", *devices}
    assert all(name in ev.detail for name in skipped), (devices, ev.detail)


def test_setuid_and_setgid_bits_are_dropped(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    tool = ws / "tool"
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o6755)
    (ws / "dir").mkdir()
    (ws / "dir").chmod(0o3777)
    sh = (
        '#!/bin/bash\n[ "$(stat -c %a /app/tool)" = 755 ] && [ "$(stat -c %a /app/dir)" = 777 ] && r=1 || r=0\n'
        "echo $r > /logs/verifier/reward.txt\n"
    )
    ev = HarborVerifier().evaluate(make_task(tmp_path, sh), ws)
    assert ev.score == 1.0, ev.detail


@pytest.mark.parametrize("what", ["sparse", "entries", "depth"])
def test_a_workspace_over_the_bounds_scores_zero_without_filling_the_disk(tmp_path: Path, what: str) -> None:
    ws = make_ws(tmp_path)
    (ws / "out.txt").write_text("the-answer-7f3a\n")
    if what == "sparse":
        with open(ws / "huge.bin", "wb") as f:
            f.truncate(64 << 30)  # 64 GiB apparent, no block allocated
    elif what == "entries":
        for i in range(60):
            (ws / f"f{i}").touch()
    else:
        d = ws
        for i in range(20):
            d = d / f"d{i}"
        d.mkdir(parents=True)
    bounds = CopyBounds(max_bytes=1 << 20, max_entries=50, max_depth=10)
    ev = HarborVerifier(bounds=bounds).evaluate(make_task(tmp_path), ws)
    # Nothing graded, and the agent's doing: 0, trained. An evaluator failure would be excluded from training, a
    # way out of every negative for a policy that plants a sparse file or 100k empty files (no block of its
    # disk quota), even with the right answer in place.
    assert (ev.score, ev.failure_class) == (0.0, "agent-disk") and "WorkspaceTooLarge" in ev.detail, ev


def test_a_workspace_under_the_bounds_with_a_sparse_file_is_graded(tmp_path: Path) -> None:
    ws = make_ws(tmp_path)
    (ws / "out.txt").write_text("the-answer-7f3a\n")
    with open(ws / "sparse.bin", "wb") as f:
        f.truncate(512 << 10)
    ev = HarborVerifier(bounds=CopyBounds(max_bytes=1 << 20)).evaluate(make_task(tmp_path), ws)
    assert ev.score == 1.0, ev.detail


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        ("mkfifo /logs/verifier/reward.json", "not a regular file"),  # would block a reader without O_NONBLOCK
        ("ln -s /app/score /logs/verifier/reward.txt", "symlink"),
        ("rm -rf /logs/verifier && ln -s /app /logs/verifier", "not a directory"),  # the host must not follow it
        ("mkdir /logs/verifier/reward.json", "not a regular file"),
        ("head -c 2000000 /dev/zero | tr '\\0' 1 > /logs/verifier/reward.txt", "over"),
    ],
)
def test_a_reward_file_that_is_not_a_bounded_regular_file_is_an_evaluator_failure(
    tmp_path: Path, plant: str, why: str
) -> None:
    ws = make_ws(tmp_path)
    (ws / "score").write_text("1\n")
    (ws / "reward.txt").write_text("1\n")
    ev = HarborVerifier().evaluate(make_task(tmp_path, f"#!/bin/bash\n{plant}\n"), ws)
    assert (ev.score, ev.failure_class) == (None, "evaluator") and why in ev.detail, ev


def test_read_reward_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.txt"
    target.write_text("1\n")
    d = tmp_path / "verifier"
    d.mkdir()
    (d / "reward.txt").symlink_to(target)
    with pytest.raises(RewardFileError, match="symlink"):
        read_reward(d)
    (d / "reward.txt").unlink()
    os.mkfifo(d / "reward.json")
    with pytest.raises(RewardFileError, match="not a regular file"):
        read_reward(d)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(RewardFileError, match="not a directory"):
        read_reward(link)


def _copy_as_owner(ws: Path, dst: Path, uid: int) -> list[str]:
    """``copy_workspace`` in a child running as ``uid`` (root reads everything: the agent's user does not)."""
    import json

    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: as the workspace's owner, without root's read-anything
        try:
            os.close(r)
            if os.geteuid() == 0:
                os.setgid(uid)
                os.setuid(uid)
            report = copy_workspace(ws, dst)
            os.write(w, json.dumps(report.skipped).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    os.waitpid(pid, 0)
    shutil.rmtree(dst, ignore_errors=True)
    assert out, "the copy raised in the child"
    skipped: list[str] = json.loads(out)
    return skipped


def test_what_the_agent_made_unreadable_is_left_out_not_a_failed_grading(tmp_path: Path) -> None:
    import tempfile

    # An unreadable workspace must not make grading fail (a sandbox failure is masked: a way out of a negative).
    # Under /tmp (1777), not $TMPDIR: the agent's uid must get through its parents (a CI's TMPDIR may be 0700).
    base = Path(tempfile.mkdtemp(prefix="og-test-unreadable-", dir="/tmp"))
    try:
        base.chmod(0o755)
        ws = base / "ws"
        (ws / "locked").mkdir(parents=True)
        (ws / "locked" / "x").write_text("1\n")
        (ws / "out.txt").write_text("the-answer-7f3a\n")
        (ws / "secret.txt").write_text("x\n")
        uid = 65534 if os.geteuid() == 0 else os.geteuid()
        for p in (base, ws, ws / "locked", ws / "locked" / "x", ws / "out.txt", ws / "secret.txt"):
            os.chown(p, uid, uid) if os.geteuid() == 0 else None
        (ws / "locked").chmod(0)
        (ws / "secret.txt").chmod(0)
        skipped = _copy_as_owner(ws, base / "copy", uid)
        assert sorted(s.split(" ")[0] for s in skipped) == ["locked", "secret.txt"], skipped
    finally:
        for p in (base / "ws" / "locked", base / "ws" / "secret.txt"):
            with contextlib.suppress(OSError):
                p.chmod(0o700)
        shutil.rmtree(base, ignore_errors=True)


def test_a_grading_that_fills_the_disk_quota_is_killed_and_scored_zero(tmp_path: Path) -> None:
    # Each file under the per-file limit, together over the quota: the sandbox's watcher ends the grading. The
    # grader is validated with the reference solution, so the code under test filled it: its failure, scored 0
    # (an excluded grading would be a way out of a negative: fill the disk whenever the answer is wrong).
    sh = (
        "#!/bin/bash\nfor i in $(seq 1 12); do head -c 1000000 /dev/zero > /app/f$i; done\n"
        "sleep 60\necho 1 > /logs/verifier/reward.txt\n"
    )
    verifier = HarborVerifier(SandboxLimits(timeout_s=120, disk_mb=8))
    ev = verifier.evaluate(make_task(tmp_path, sh), make_ws(tmp_path))
    assert (ev.score, ev.failure_class) == (0.0, "agent-disk") and "disk quota" in ev.detail, ev


# The code under test (the workspace's run.py) runs as the grader's user in the grader's sandbox: it writes a
# reward of its own, then ends its grader so that the grader's verdict never replaces it.
PLANT = "mkdir -p /logs/verifier; echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; "
KILLS = {
    "sigkill-test-sh": PLANT + "kill -KILL $PPID",  # test.sh's bash (exec'd by the launcher)
    "sigterm-test-sh": PLANT + "kill -TERM $PPID",
    "sigsegv-test-sh": PLANT + "kill -SEGV $PPID",
    # The sandbox's launcher, test.sh's parent: its status report never comes.
    "sigkill-launcher": PLANT + "kill -KILL $(ps -o ppid= -p $PPID)",
    # Every process of the sandbox but itself, with every signal that kills.
    "everything": PLANT + "for s in TERM INT HUP KILL; do for p in $(ls /proc | grep '^[0-9]'); do "
    '[ "$p" != $$ ] && kill -$s $p 2>/dev/null; done; done',
}
# Harbor's shape: the code under test first, then the verdict (here always 0: the answer is wrong).
RUN_APP = "#!/bin/bash\nbash /app/run.sh\necho 0 > /logs/verifier/reward.txt\n"


@pytest.mark.parametrize("how", sorted(KILLS))
def test_code_under_test_that_kills_its_grader_scores_zero_not_its_own_reward(tmp_path: Path, how: str) -> None:
    ws = make_ws(tmp_path)
    (ws / "run.sh").write_text(KILLS[how] + "\nsleep 30\n")
    ev = HarborVerifier(SandboxLimits(timeout_s=60)).evaluate(make_task(tmp_path, RUN_APP), ws)
    # No OOM kill on the machine meanwhile: the SIGKILL was the code's own; nothing masked, nothing it wrote read.
    assert (ev.score, ev.failure_class) == (0.0, "agent-killed"), (how, ev)


def test_a_forged_status_report_is_not_read_as_an_oom_kill(tmp_path: Path) -> None:
    # The launcher's status pipe, reached through /proc/<pid>/fd of any process in the sandbox: "9" would read as
    # a SIGKILL from outside, the OOM killer's (masked as infrastructure). The launcher is out of reach.
    forge = (
        "for p in $(ls /proc | grep '^[0-9]'); do for f in /proc/$p/fd/*; do "
        '[ -p "$f" ] && echo 9 > "$f" 2>/dev/null; done; done; echo 0 > /logs/verifier/reward.txt'
    )
    ws = make_ws(tmp_path)
    (ws / "run.sh").write_text(forge + "\n")
    ev = HarborVerifier(SandboxLimits(timeout_s=60)).evaluate(
        make_task(tmp_path, "#!/bin/bash\nbash /app/run.sh\n"), ws
    )
    assert (ev.score, ev.failure_class) == (0.0, None), ev


def test_a_symlink_through_a_path_too_long_to_follow_on_the_host_is_left_out(tmp_path: Path) -> None:
    # 16 directories of 250 characters, then "up" -> /tests: the link's target fits a symlink (< 4096) and, from
    # /app, a path the grader's kernel resolves; from the host's longer workspace path it is past PATH_MAX.
    (tmp_path / ("w" * 200)).mkdir()
    ws = make_ws(tmp_path / ("w" * 200))
    rel = [f"{i:02d}" + "x" * 248 for i in range(16)]
    fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for name in rel:  # made relative to directory descriptors: the whole path is too long to name at once
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        os.symlink("/tests", "up", dir_fd=fd)
    finally:
        os.close(fd)
    target = "/".join([*rel, "up", "expected.txt"])
    assert len(target) < 4096 and len(str(ws)) + len("/".join([*rel, "up"])) > 4096  # the host cannot name "up"
    (ws / "out.txt").symlink_to(target)
    report = copy_workspace(ws, tmp_path / "copy")
    assert any(s.startswith("out.txt (") for s in report.skipped), report.skipped


def test_what_the_grader_runs_by_name_or_imports_is_never_the_workspaces(tmp_path: Path) -> None:
    """The workspace plants what a grader's shell, Python or pytest might pick up from its working directory
    (``/app``): programs named as the grader's, a shell rc, Python's startup hooks, a module shadowing the
    standard library, pytest's configuration and plugins. Each writes the reward it wants; none may run for a
    grader that runs a script (``python3 /tests/x.py``) or pytest's own entry point. (``python3 -c``/``-m`` from
    ``/app`` put ``/app`` first on ``sys.path``: the planted ``json.py`` wins there, a limit of such a test.sh,
    docs/sandbox.md.)"""
    import sys

    ws = make_ws(tmp_path)
    win_sh = "#!/bin/bash\necho '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"
    win_py = "import os\nopen('/logs/verifier/reward.json', 'w').write('{\"reward\": 1.0}')\n"
    for name in ("python3", "python", "bash", "sh", "pytest", "cat", "echo"):
        (ws / name).write_text(win_sh)
        (ws / name).chmod(0o755)
    for name in (".bashrc", ".profile", ".bash_profile"):
        (ws / name).write_text(win_sh)
    for name in ("sitecustomize.py", "usercustomize.py", "json.py", "conftest.py"):
        (ws / name).write_text(win_py)
    (ws / "og.pth").write_text("import os; open('/logs/verifier/reward.json', 'w').write('{\"reward\": 1.0}')\n")
    (ws / "pytest.ini").write_text("[pytest]\naddopts = -p conftest\n")
    (ws / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = '-p conftest'\n")
    task = make_task(tmp_path, "")
    (task / "tests" / "check.py").write_text("import json, os, subprocess\nprint(json.dumps(0))\n")
    (task / "tests" / "test_check.py").write_text("import json\n\ndef test_ok():\n    assert json.dumps(0) == '0'\n")
    pytest_bin = Path(sys.prefix) / "bin" / "pytest"
    # 0.5 when every step ran (pytest passing included), 0.25 when one failed; a planted file would write 1.0.
    (task / "tests" / "test.sh").write_text(
        "#!/bin/bash\ncd /app\nr=0.5\n"
        "python3 /tests/check.py && bash -c true && sh -c true && cat /dev/null || r=0.25\n"
        f"{pytest_bin} -q -p no:cacheprovider /tests/test_check.py || r=0.25\n"
        "echo $r > /logs/verifier/reward.txt\n"
    )
    ev = HarborVerifier(SandboxLimits(timeout_s=120)).evaluate(task, ws)
    assert (ev.score, ev.failure_class) == (0.5, None), ev


_UNREADABLE = """
import json, os, sys
from pathlib import Path
from opengyre.grading import HarborVerifier
task, ws = Path(sys.argv[1]), Path(sys.argv[2])
os.chmod(ws, 0)  # the agent's last command: chmod 000 /app (it owns /app: its user is mapped onto ours)
try:
    ev = HarborVerifier().evaluate(task, ws)
finally:
    os.chmod(ws, 0o700)
print(json.dumps([ev.score, ev.failure_class, ev.detail]))
"""


def test_a_workspace_made_unreadable_to_its_owner_is_graded_not_masked(tmp_path: Path) -> None:
    # A stack of an ordinary user has no DAC override: the copy could not open such a workspace, a `sandbox`
    # failure (infrastructure, masked in training) for a wrong answer. As root, drop the override.
    ws = make_ws(tmp_path)
    (ws / "out.txt").write_text("a wrong answer\n")
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
    argv = [*drop, sys.executable, "-c", _UNREADABLE, str(make_task(tmp_path)), str(ws)]
    run = subprocess.run(argv, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    score, failure_class, detail = json.loads(run.stdout.splitlines()[-1])
    assert (score, failure_class) == (0.0, None) and "cannot be read" in detail, (score, failure_class, detail)
