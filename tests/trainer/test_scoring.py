"""Harbor-style verification in the local sandbox: partial scores for timed-out work, evaluator failures that
are not zeros, infrastructure failures that are never graded."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from opengyre.events import default_registry
from opengyre.grading import HarborVerifier, RewardFileEmptyError, RewardFileNotFoundError, read_reward
from opengyre.sandbox import SandboxLimits
from opengyre.trainer import ExecutionOutcome, classify_outcome, score_execution

GRADE_FRACTION = """#!/bin/bash
# half a point per correct file; reads the workspace at /app and writes Harbor's reward file
score=0
grep -qx 42 /app/a.txt 2>/dev/null && score=$((score+1))
grep -qx 43 /app/b.txt 2>/dev/null && score=$((score+1))
python3 -c "print($score / 2)" > /logs/verifier/reward.txt
"""


def make_task(root: Path, test_sh: str, toml: str = "") -> Path:
    task = root / "task"
    (task / "tests").mkdir(parents=True)
    (task / "tests" / "test.sh").write_text(test_sh)
    (task / "instruction.md").write_text("write 42 to a.txt and 43 to b.txt\n")
    if toml:
        (task / "task.toml").write_text(toml)
    return task


def workspace(root: Path, files: dict[str, str]) -> Path:
    ws = root / "ws"
    ws.mkdir()
    for k, v in files.items():
        (ws / k).write_text(v)
    return ws


def test_partial_work_gets_its_real_score(tmp_path: Path) -> None:
    task = make_task(tmp_path, GRADE_FRACTION)
    ev = HarborVerifier().evaluate(task, workspace(tmp_path, {"a.txt": "42\n"}))
    assert ev.valid and ev.score == 0.5


def test_timed_out_execution_is_graded_not_zeroed(tmp_path: Path) -> None:
    task = make_task(tmp_path, GRADE_FRACTION)
    ws = workspace(tmp_path, {"a.txt": "42\n", "b.txt": "43\n"})
    fin = score_execution("ex1", HarborVerifier(), task, ws, timed_out=True, exit_code=124)
    assert fin.status == "timed-out" and fin.score == 1.0 and fin.failure_class is None


def test_reward_json_wins_and_keeps_metrics(tmp_path: Path) -> None:
    sh = (
        "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"
        'echo \'{"reward": 0.75, "acc": 1}\' > /logs/verifier/reward.json\n'
    )
    ev = HarborVerifier().evaluate(make_task(tmp_path, sh), workspace(tmp_path, {}))
    assert ev.score == 0.75 and ev.metrics == {"reward": 0.75, "acc": 1.0}


def test_missing_reward_file_is_an_evaluator_failure_not_a_zero(tmp_path: Path) -> None:
    ev = HarborVerifier().evaluate(make_task(tmp_path, "#!/bin/bash\nexit 1\n"), workspace(tmp_path, {}))
    assert ev.score is None and ev.failure_class == "evaluator" and "RewardFileNotFoundError" in ev.detail
    fin = score_execution("ex", HarborVerifier(), tmp_path / "task", tmp_path / "ws")
    assert fin.status == "evaluator-failed" and fin.score is None


def test_empty_reward_file(tmp_path: Path) -> None:
    sh = "#!/bin/bash\n: > /logs/verifier/reward.txt\n"
    ev = HarborVerifier().evaluate(make_task(tmp_path, sh), workspace(tmp_path, {}))
    assert ev.score is None and "RewardFileEmptyError" in ev.detail


def test_grader_timeout_from_task_toml(tmp_path: Path) -> None:
    task = make_task(
        tmp_path, "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n", "[verifier]\ntimeout_sec = 1.0\n"
    )
    ev = HarborVerifier().evaluate(task, workspace(tmp_path, {}))
    # the grader's limits bound the code under test: running past them scores the workspace 0
    assert ev.score == 0.0 and ev.failure_class == "agent-timeout" and ev.exit_code == 124


def test_verifier_env_from_task_toml(tmp_path: Path) -> None:
    sh = '#!/bin/bash\necho "$PASS_MARK" > /logs/verifier/reward.txt\n'
    task = make_task(tmp_path, sh, '[verifier]\nenv = { PASS_MARK = "0.25" }\n')
    assert HarborVerifier(SandboxLimits(timeout_s=30)).evaluate(task, workspace(tmp_path, {})).score == 0.25


def test_task_toml_keeps_the_verifiers_other_limits(tmp_path: Path) -> None:
    # The CPU-time limit is applied inside the grader's sandbox whatever its backend (RLIMIT_CPU, per process).
    sh = '#!/bin/bash\n[ "$(ulimit -t)" = 4321 ] && r=1 || r=0\necho $r > /logs/verifier/reward.txt\n'
    task = make_task(tmp_path, sh, "[verifier]\ntimeout_sec = 30.0\n")
    ev = HarborVerifier(SandboxLimits(cpu_s=4321)).evaluate(task, workspace(tmp_path, {}))
    assert ev.score == 1.0


def test_an_impossible_timeout_in_task_toml_is_an_evaluator_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n", "[verifier]\ntimeout_sec = 0\n")
    ev = HarborVerifier().evaluate(task, workspace(tmp_path, {}))
    assert ev.score is None and ev.failure_class == "evaluator" and "bad task.toml" in ev.detail


def test_a_workspace_with_a_dead_servers_socket_is_graded(tmp_path: Path) -> None:
    ws = workspace(tmp_path, {"a.txt": "42\n", "b.txt": "43\n"})
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(ws / "server.sock"))
    try:
        ev = HarborVerifier().evaluate(make_task(tmp_path, GRADE_FRACTION), ws)
    finally:
        server.close()
    assert ev.valid and ev.score == 1.0


def test_a_verifier_with_impossible_limits_is_refused_when_made() -> None:
    # Not at grading time, where it would read as every task's evaluator failure.
    with pytest.raises(ValueError):
        HarborVerifier(SandboxLimits(memory_mb=1))


def test_infra_failure_is_not_graded(tmp_path: Path) -> None:
    task = make_task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    fin = score_execution("ex", HarborVerifier(), task, workspace(tmp_path, {}), exit_code=137, output="Killed")
    assert fin.status == "infra-failed" and fin.failure_class == "oom" and fin.score is None
    # A network failure is what the runtime reports, not what the agent printed.
    net = score_execution("ex", HarborVerifier(), task, tmp_path / "ws", exit_code=1, failure="network")
    assert net.status == "completed" and net.score == 1.0 and net.failure_class == "network"  # transient
    said = score_execution("ex", HarborVerifier(), task, tmp_path / "ws", exit_code=1, output="Could not resolve host")
    assert said.status == "completed" and said.score == 1.0 and said.failure_class is None
    with pytest.raises(ValueError):
        score_execution("ex", HarborVerifier(), task, tmp_path / "ws", failure="agent-timeout")  # not the runtime's


def test_the_finish_carries_the_harness_sandbox_and_refuses_one_that_names_none(tmp_path: Path) -> None:
    task = make_task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    ws = workspace(tmp_path, {})
    killed = score_execution("ex", HarborVerifier(), task, ws, exit_code=137, failure="oom", sandbox="none")
    assert (killed.status, killed.sandbox) == ("infra-failed", "none")  # not graded, still said
    assert score_execution("ex", HarborVerifier(), task, ws).sandbox == ""  # not known: an abandoned one
    for bad in ("Namespace", "no isolation", "x" * 40):
        with pytest.raises(ValueError, match="sandbox must name an isolation"):
            score_execution("ex", HarborVerifier(), task, ws, sandbox=bad)


def test_exit_137_of_a_harness_whose_runtime_names_its_sandbox_is_graded_not_guessed_an_oom(tmp_path: Path) -> None:
    # The runtime that names its sandbox saw how the harness ended and reports an OOM kill itself; a 137 without
    # it is the policy's own ``kill -9`` of its harness (or its exit code): graded, never masked.
    task = make_task(tmp_path, "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n")
    fin = score_execution("ex", HarborVerifier(), task, workspace(tmp_path, {}), exit_code=137, sandbox="namespace")
    assert (fin.status, fin.score, fin.failure_class) == ("completed", 0.0, None), fin


def test_a_crashed_harness_with_binary_output_still_ends_as_an_event_every_store_keeps(tmp_path: Path) -> None:
    task = make_task(tmp_path, "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    out = "garbage \x00\x01 from /dev/urandom"
    fin = score_execution("ex", HarborVerifier(), task, tmp_path / "ws", exit_code=139, output=out, failure="sandbox")
    assert fin.status == "infra-failed" and fin.failure_class == "sandbox" and fin.score is None
    assert "\x00" not in fin.detail and fin.detail.startswith("garbage")
    default_registry().encode(fin)  # raised InvalidEvent (a NUL): ScoreExecution failed, the execution never ended


# A grader that runs the agent's solution and gives 1 if it prints the answer (Harbor-style: test.sh owns the run).
RUN_SOLUTION = """#!/bin/bash
out=$(python3 /app/solve.py)
[ "$out" = 42 ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


def test_a_solution_that_loops_forever_scores_zero_as_the_agents_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, RUN_SOLUTION, "[verifier]\ntimeout_sec = 1.0\n")
    ws = workspace(tmp_path, {"solve.py": "while True:\n    pass\n"})
    fin = score_execution("ex", HarborVerifier(), task, ws)
    assert (fin.status, fin.score, fin.failure_class) == ("completed", 0.0, "agent-timeout")
    assert classify_outcome(ExecutionOutcome("ex", "g", fin.status, fin.score, fin.failure_class))[0] == "ok"


def test_a_solution_that_allocates_until_killed_scores_zero_as_the_agents_failure(tmp_path: Path) -> None:
    task = make_task(tmp_path, RUN_SOLUTION, "[verifier]\ntimeout_sec = 60.0\n")
    ws = workspace(tmp_path, {"solve.py": "hog = []\nwhile True:\n    hog.append(b'x' * (4 << 20))\n"})
    verifier = HarborVerifier(SandboxLimits(timeout_s=60.0, memory_mb=1024, group_memory_mb=64))
    fin = score_execution("ex", verifier, task, ws)
    assert (fin.status, fin.score, fin.failure_class) == ("completed", 0.0, "agent-oom")
    assert classify_outcome(ExecutionOutcome("ex", "g", fin.status, fin.score, fin.failure_class))[0] == "ok"


def test_printing_memoryerror_is_not_infrastructure(tmp_path: Path) -> None:
    # The agent's process printed "MemoryError" and exited 1: graded, the print changes nothing.
    task = make_task(tmp_path, GRADE_FRACTION)
    ws = workspace(tmp_path, {"a.txt": "42\n"})
    fin = score_execution("ex", HarborVerifier(), task, ws, exit_code=1, output="Traceback ...\nMemoryError\n")
    assert (fin.status, fin.score, fin.failure_class) == ("completed", 0.5, None)
    # Its solution does the same under the grader: the grader's verdict is the score.
    printing = make_task(tmp_path / "p", RUN_SOLUTION)
    ws2 = workspace(tmp_path / "p", {"solve.py": "import sys\nprint('MemoryError')\nsys.exit(1)\n"})
    fin2 = score_execution("ex", HarborVerifier(), printing, ws2)
    assert (fin2.status, fin2.score, fin2.failure_class) == ("completed", 0.0, None)


def test_a_grader_without_a_reward_is_excluded_and_one_killed_from_inside_scores_zero(tmp_path: Path) -> None:
    silent = make_task(tmp_path, "#!/bin/bash\nexit 3\n")
    fin = score_execution("ex", HarborVerifier(), silent, workspace(tmp_path, {}))
    assert (fin.status, fin.score, fin.failure_class) == ("evaluator-failed", None, "evaluator")
    assert classify_outcome(ExecutionOutcome("ex", "g", fin.status, fin.score, fin.failure_class))[0] == "excluded"
    # A grader ended by a signal the sandbox did not send, with no OOM kill on the machine: the code under test
    # runs as the grader's user and may have sent it (after writing its own reward): the agent's failure, 0.
    for sig in ("SEGV", "KILL"):
        killed = make_task(tmp_path / sig, f"#!/bin/bash\necho 1 > /logs/verifier/reward.txt\nkill -{sig} $$\n")
        fin2 = score_execution("ex", HarborVerifier(), killed, workspace(tmp_path / sig, {}))
        assert (fin2.status, fin2.score, fin2.failure_class) == ("completed", 0.0, "agent-killed"), sig
        assert classify_outcome(ExecutionOutcome("ex", "g", fin2.status, fin2.score, fin2.failure_class))[0] == "ok"


def test_read_reward_errors(tmp_path: Path) -> None:
    with pytest.raises(RewardFileNotFoundError):
        read_reward(tmp_path)
    (tmp_path / "reward.json").write_text("")
    with pytest.raises(RewardFileEmptyError):
        read_reward(tmp_path)
    (tmp_path / "reward.json").write_text(json.dumps({"reward": "high"}))
    with pytest.raises(ValueError):
        read_reward(tmp_path)
