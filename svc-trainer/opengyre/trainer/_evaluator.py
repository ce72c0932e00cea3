"""Scoring a finished execution: the task's evaluator on the preserved workspace.

The Harbor convention: ``tests/test.sh`` runs against the workspace and writes ``/logs/verifier/reward.json``
(``{"reward": x, ...}``) or ``/logs/verifier/reward.txt`` (one number); ``reward.json`` wins. A missing file is
``RewardFileNotFoundError``, an empty one ``RewardFileEmptyError``: both mean *no valid score*, which is not a
zero. The local process sandbox cannot mount ``/logs``, ``/tests`` and ``/app``, so the verifier copies the
tests and the workspace into the sandbox and rewrites those absolute paths in the test files to the copies.

The grader runs the agent's code, and its limits bound that code: a grader that runs past its time limit, or
whose processes together exceed the sandbox's memory, scores the workspace 0 (``agent-timeout``,
``agent-oom``): the solution under test hung or ran out of memory, and a policy must not learn that hanging
escapes a negative. Tasks are validated with their reference solution through the same verifier, so the
grader itself is known to finish on a good workspace. The grader's own failures stay failures without a score:
no reward file or a crash (``evaluator``, excluded), the sandbox not starting (``sandbox``), the grader killed
by a SIGKILL the sandbox did not send (``oom``: the system's OOM killer), both masked as infrastructure.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import tomllib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from opengyre.events import FailureClass
from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits

__all__ = [
    "Evaluation",
    "Evaluator",
    "HarborVerifier",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "read_reward",
]

_MOUNTS = ("logs", "tests", "app")
_ABS = re.compile(r"(?<![\w.~/$-])/(logs|tests|app)(?=/|\b)")


class RewardFileError(ValueError):
    """The verifier left no usable reward."""


class RewardFileNotFoundError(RewardFileError):
    pass


class RewardFileEmptyError(RewardFileError):
    pass


@dataclass(frozen=True)
class Evaluation:
    """A valid score, or none with the reason (``failure_class`` says whose fault)."""

    score: float | None
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    detail: str = ""
    metrics: dict[str, float] | None = None

    @property
    def valid(self) -> bool:
        return self.score is not None


def read_reward(verifier_dir: Path) -> dict[str, float]:
    """Harbor's reading order: reward.json (an object of numbers), else reward.txt (one number)."""
    js, txt = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    if js.exists():
        raw = js.read_text().strip()
        if not raw:
            raise RewardFileEmptyError(f"{js} is empty")
        data = json.loads(raw)
        if not isinstance(data, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
        ):
            raise RewardFileError(f"{js} is not an object of numbers")
        return {str(k): float(v) for k, v in data.items()}
    if txt.exists():
        raw = txt.read_text().strip()
        if not raw:
            raise RewardFileEmptyError(f"{txt} is empty")
        return {"reward": float(raw)}
    raise RewardFileNotFoundError(f"no reward.json or reward.txt in {verifier_dir}")


class Evaluator(ABC):
    @abstractmethod
    def evaluate(self, task_dir: Path, workspace: Path) -> Evaluation:
        """Grade the preserved ``workspace`` with the task's grader; never raises for a grader's fault."""


class HarborVerifier(Evaluator):
    """Runs a Harbor task's ``tests/test.sh`` in the local process sandbox."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        # The processes of a grading together get twice one process's address space, in resident memory.
        self.limits = limits or SandboxLimits(timeout_s=600.0, group_memory_mb=4096)
        self.limits.validate()  # the verifier's own limits are checked here: later, only a task's can be wrong

    def _task_limits(self, task_dir: Path) -> tuple[SandboxLimits, dict[str, str]]:
        toml = task_dir / "task.toml"
        if not toml.exists():
            return self.limits, {}
        verifier = tomllib.loads(toml.read_text()).get("verifier", {})
        timeout = float(verifier.get("timeout_sec", self.limits.timeout_s))
        env = {str(k): str(v) for k, v in dict(verifier.get("env", {})).items()}
        # The task sets the time; every other limit stays the verifier's own.
        limits = dataclasses.replace(self.limits, timeout_s=timeout)
        limits.validate()  # a task's impossible timeout is the task's fault: an evaluator failure, not a crash
        return limits, env

    def evaluate(self, task_dir: Path, workspace: Path) -> Evaluation:
        task_dir, workspace = Path(task_dir), Path(workspace)
        test_sh = task_dir / "tests" / "test.sh"
        if not test_sh.exists():
            return Evaluation(None, "evaluator", detail=f"task has no tests/test.sh: {task_dir}")
        try:
            limits, env = self._task_limits(task_dir)
        except (tomllib.TOMLDecodeError, ValueError, TypeError) as exc:
            return Evaluation(None, "evaluator", detail=f"bad task.toml: {exc}")
        try:
            with LocalSandbox(limits) as sb:
                sb.copy_in(workspace, "app") if workspace.is_dir() else (sb.root / "app").mkdir()
                sb.copy_in(task_dir / "tests", "tests")
                (sb.root / "logs" / "verifier").mkdir(parents=True)
                (sb.root / "logs" / "agent").mkdir()
                _rewrite_paths(sb.root / "tests", sb.root)
                result = sb.run(["bash", str(sb.root / "tests" / "test.sh")], cwd="app", env=env)
                if result.timed_out:
                    why = f"agent-timeout: grading ran past its {limits.timeout_s:g} s: the solution under test hung"
                    return Evaluation(0.0, "agent-timeout", result.exit_code, f"{why}; {_tail(result.output)}")
                if result.memory_exceeded:
                    why = f"agent-oom: grading exceeded {limits.group_memory_mb} MB: the solution exhausted memory"
                    return Evaluation(0.0, "agent-oom", result.exit_code, f"{why}; {_tail(result.output)}")
                if result.signal == 9:  # a SIGKILL the sandbox did not send: the system's OOM killer
                    why = "oom: the grader was killed by SIGKILL from outside the sandbox"
                    return Evaluation(None, "oom", result.exit_code, f"{why}; {_tail(result.output)}")
                try:
                    metrics = read_reward(sb.root / "logs" / "verifier")
                except ValueError as exc:  # RewardFileError, a JSON or number that does not parse
                    detail = f"{type(exc).__name__}: {exc}"
                    if isinstance(exc, RewardFileNotFoundError):
                        detail = f"RewardFileNotFoundError: test.sh exited {result.exit_code}; {_tail(result.output)}"
                    return Evaluation(None, "evaluator", result.exit_code, detail)
        except SandboxError as exc:
            return Evaluation(None, "sandbox", None, str(exc))
        reward = metrics.get("reward")
        if reward is None or not math.isfinite(reward):
            return Evaluation(None, "evaluator", result.exit_code, f"no finite 'reward' in {sorted(metrics)}")
        return Evaluation(reward, None, result.exit_code, "", metrics)


def _rewrite_paths(tests_dir: Path, root: Path) -> None:
    for f in tests_dir.rglob("*"):
        if not f.is_file():
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary fixtures stay as they are
        new = _ABS.sub(lambda m: str(root / m.group(1)), text)
        if new != text:
            f.write_text(new)


def _tail(text: str, n: int = 2000) -> str:
    return text[-n:]
