"""The synthesized task's grader (``tests/grade.py``, ``tests/test.sh``) against a solution whose code it runs: a
``command`` item executes the workspace's program as the grader's user, in the grader's sandbox, where that
program can write ``/logs/verifier/reward.json`` itself. Each case is a program that prints the wrong answer
and tries to make its own reward stand; an honest program scores 1 through the same grader, so each can fail."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opengyre.grading import HarborVerifier
from opengyre.sandbox import SandboxLimits
from opengyre.synth import GRADER_SOURCE, TEST_SH

# The program's right answer is 42 on stdout; every attack below prints 41.
RUBRIC = {
    "pass_threshold": 1.0,
    "items": [
        {"id": "c0.runs", "challenge": "c0", "weight": 1.0, "kind": "command", "argv": ["python3", "/app/service.py"],
         "expect_stdout": "42"},
    ],
}  # fmt: skip
PLANT = """
import os, signal, sys
os.makedirs("/logs/verifier", exist_ok=True)
with open("/logs/verifier/reward.json", "w") as f:
    f.write('{"reward": 1.0}')
"""
ATTACKS = {
    # Its own reward, then the grader (its parent) killed before it can write one.
    "kill-the-grader": PLANT + "print(41, flush=True)\nos.kill(os.getppid(), signal.SIGKILL)\n",
    # Its own reward, then an output the grader's memory cannot hold, so the grader dies of it.
    "flood": PLANT + "chunk = b'4' * (1 << 20)\nwhile True:\n    sys.stdout.buffer.write(chunk)\n",
    # A daemon that outlives the command (its own session) and writes its reward over the grader's, once written.
    "daemon": """
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        for fd in (0, 1, 2):
            os.close(fd)
        path, deadline = "/logs/verifier/reward.json", time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if "1.0" not in open(path).read():
                    with open(path, "w") as f:
                        f.write('{"reward": 1.0}')
            except OSError:
                pass
    os._exit(0)
print(41)
""",
    # The reward's place taken: a symlink the grader would write through (the host refuses to read one: no
    # score, excluded), and the directory replaced by a link to the workspace.
    "symlink-the-reward": "import os\nos.symlink('/tmp/elsewhere', '/logs/verifier/reward.json')\nprint(41)\n",
    "directory-in-its-place": "import os\nos.mkdir('/logs/verifier/reward.json')\nprint(41)\n",
    "link-the-directory": "import os, shutil\nshutil.rmtree('/logs/verifier')\nos.symlink('/app', '/logs/verifier')\n"
    "print(41)\n",
    # Its own reward, then the grader asked to end (SIGTERM): a grader dying of it leaves that reward behind.
    "terminate-the-grader": PLANT + "print(41, flush=True)\nos.kill(os.getppid(), signal.SIGTERM)\n",
}


def _task(root: Path) -> Path:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text(TEST_SH)
    (task / "tests" / "grade.py").write_text(GRADER_SOURCE.lstrip())
    (task / "tests" / "rubric.json").write_text(json.dumps(RUBRIC))
    return task


def _grade(tmp_path: Path, program: str) -> tuple[float | None, str | None, str]:
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "service.py").write_text(program)
    # RLIMIT_AS small enough that a flood held in the grader's memory ends it within a second.
    verifier = HarborVerifier(SandboxLimits(timeout_s=120, memory_mb=256, group_memory_mb=1024))
    ev = verifier.evaluate(_task(tmp_path), ws)
    return ev.score, ev.failure_class, ev.detail


def test_an_honest_program_scores_one_so_the_attacks_can_fail(tmp_path: Path) -> None:
    assert _grade(tmp_path, "print(42)\n")[:2] == (1.0, None)


def test_a_wrong_program_scores_zero(tmp_path: Path) -> None:
    assert _grade(tmp_path, "print(41)\n")[:2] == (0.0, None)


@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_a_program_cannot_make_its_own_reward_stand(tmp_path: Path, attack: str) -> None:
    score, failure, detail = _grade(tmp_path, ATTACKS[attack])
    # Graded 0, as the agent's own failure where it killed its grader: never its reward, never masked.
    assert score == 0.0 and failure in (None, "agent-killed"), (attack, score, failure, detail)


def test_a_reward_planted_in_the_workspace_before_grading_is_not_the_verdict(tmp_path: Path) -> None:
    # The grader removes what is in /logs/verifier before it starts (the directory is fresh per grading anyway).
    program = "print(41)\n"
    sh = "#!/bin/bash\nmkdir -p /logs/verifier\necho '{\"reward\": 1.0}' > /logs/verifier/reward.json\n"
    task = _task(tmp_path)
    (task / "tests" / "test.sh").write_text(sh + TEST_SH.split("\n", 1)[1])
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "service.py").write_text(program)
    assert HarborVerifier(SandboxLimits(timeout_s=120)).evaluate(task, ws).score == 0.0


def test_reward_json_holds_the_reward_only_and_the_items_go_to_diagnostics(tmp_path: Path) -> None:
    # Harbor's job mean averages every key of reward.json as a reward: per-item scores and counts there would be
    # averaged with it. A judge item (no judge configured) is counted as unjudged, in the diagnostics too.
    task = _task(tmp_path)
    judge = {"id": "c0.style", "challenge": "c0", "weight": 1.0, "kind": "judge", "criterion": "tidy"}
    (task / "tests" / "rubric.json").write_text(json.dumps({**RUBRIC, "items": [*RUBRIC["items"], judge]}))
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "service.py").write_text("print(42)\n")
    ev = HarborVerifier(SandboxLimits(timeout_s=120)).evaluate(task, ws)
    assert ev.score == 1.0 and ev.metrics == {"reward": 1.0}, ev
    assert ev.diagnostics == {"item.c0.runs": 1.0, "unjudged_items": 1.0}, ev


def test_a_bad_diagnostics_file_is_left_out_and_the_reward_stands(tmp_path: Path) -> None:
    from opengyre.grading import read_diagnostics

    (tmp_path / "diagnostics.json").write_text('{"item.x": "not a number"}')
    assert read_diagnostics(tmp_path) == (None, "diagnostics.json left out: not an object of numbers")
    (tmp_path / "diagnostics.json").write_text('{"item.x": 0.5}')
    assert read_diagnostics(tmp_path) == ({"item.x": 0.5}, "")
    (tmp_path / "diagnostics.json").unlink()
    assert read_diagnostics(tmp_path) == (None, "")
