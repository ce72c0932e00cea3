"""Scoring a finished execution: the task's evaluator on the preserved workspace.

The Harbor convention: ``tests/test.sh`` runs against the workspace and writes ``/logs/verifier/reward.json``
(``{"reward": x, ...}``) or ``/logs/verifier/reward.txt`` (one number); ``reward.json`` wins. A missing file is
``RewardFileNotFoundError``, an empty one ``RewardFileEmptyError``: both mean *no valid score*, which is not a
zero.

The grader runs after the agent, apart from it: in a fresh namespace sandbox of its own, where ``/app`` is a
copy of the preserved workspace, ``/tests`` the task's tests (copied in only now, read-only: the code under
test must not rewrite its checker), and ``/logs/verifier``, ``/logs/agent`` writable directories the agent never
saw. The paths are the real ones Harbor tests name; nothing in the tests is rewritten. The workspace is the
agent's output, so it is copied defensively (``_workspace.copy_workspace``: symlinks kept as symlinks unless they
lead into the grader's own directories, special files and hard links to outside files left out, setuid/setgid
bits dropped, its size bounded), and the reward file is read from the host without following a symlink, only
as a regular file of bounded size (a FIFO planted there blocks nothing). A backend that cannot show the grader
those paths (``none``: the host's view) cannot grade: a ``sandbox`` failure, never a silent wrong score.

The grader runs the agent's code, and its limits bound that code: a grader that runs past its time limit, or
whose processes together exceed the sandbox's memory, scores the workspace 0 (``agent-timeout``,
``agent-oom``): the solution under test hung or ran out of memory, and a policy must not learn that hanging
escapes a negative. Tasks are validated with their reference solution through the same verifier, so the
grader itself is known to finish on a good workspace. The grader's own failures stay failures without a score:
no reward file, one that is not a regular file of bounded size, or a crash (``evaluator``, excluded); the
sandbox not starting (``sandbox``), the grader killed by a SIGKILL the sandbox did not send while the kernel
counted an OOM kill (``oom``: the system's OOM killer), both masked as infrastructure. A grading that fills the
grader's disk quota is the code under test's doing (``agent-disk``, 0), as is a workspace over the copy's bounds
(apparent size, entries, depth: nothing is graded, and the agent made it so; ``agent-disk``, 0), or a grader
killed by any other signal the sandbox did not send, or by a SIGKILL with no OOM kill on the machine
(``agent-killed``, 0): the code under test runs as the grader's user and can kill it, after writing a reward
file of its own, which is then not read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
import tomllib
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

from opengyre.events import FailureClass
from opengyre.sandbox import LocalSandbox, Mount, SandboxError, SandboxLimits

from ._workspace import CopyBounds, UnsafeFileError, WorkspaceTooLarge, copy_workspace, read_bounded

__all__ = [
    "Evaluation",
    "Evaluator",
    "HarborVerifier",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "read_diagnostics",
    "read_reward",
]

REWARD_LIMIT = 1 << 20  # bytes of reward.json / reward.txt read back
# Backends whose commands see the host's own paths, not the mounts at their targets: no /app, /tests, /logs.
_HOST_VIEW = ("none", "nested")


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
    metrics: dict[str, float] | None = None  # reward.json: rewards only (Harbor averages each key as a reward)
    # diagnostics.json beside it, when the grader wrote one (per-item scores, counts): never a reward
    diagnostics: dict[str, float] | None = None

    @property
    def valid(self) -> bool:
        return self.score is not None


def _read(verifier_dir: Path, name: str) -> str | None:
    try:
        data = read_bounded(verifier_dir, name, REWARD_LIMIT)
    except UnsafeFileError as exc:
        raise RewardFileError(str(exc)) from None
    return None if data is None else data.decode("utf-8", errors="replace")


def read_reward(verifier_dir: Path) -> dict[str, float]:
    """Harbor's reading order: reward.json (an object of numbers), else reward.txt (one number).

    Each is read only as a regular file of at most ``REWARD_LIMIT`` bytes, not through a symlink (the directory
    included): anything else there is a ``RewardFileError``."""
    verifier_dir = Path(verifier_dir)
    js, txt = verifier_dir / "reward.json", verifier_dir / "reward.txt"
    raw = _read(verifier_dir, "reward.json")
    if raw is not None:
        raw = raw.strip()
        if not raw:
            raise RewardFileEmptyError(f"{js} is empty")
        data = json.loads(raw)
        if not isinstance(data, dict) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
        ):
            raise RewardFileError(f"{js} is not an object of numbers")
        return {str(k): float(v) for k, v in data.items()}
    raw = _read(verifier_dir, "reward.txt")
    if raw is not None:
        raw = raw.strip()
        if not raw:
            raise RewardFileEmptyError(f"{txt} is empty")
        return {"reward": float(raw)}
    raise RewardFileNotFoundError(f"no reward.json or reward.txt in {verifier_dir}")


def read_diagnostics(verifier_dir: Path) -> tuple[dict[str, float] | None, str]:
    """``diagnostics.json`` (an object of numbers) when the grader wrote one, else None; a bad one is None with
    why (it is no part of the score: a grade stands without it)."""
    try:
        raw = _read(Path(verifier_dir), "diagnostics.json")
        if raw is None:
            return None, ""
        data = json.loads(raw)
    except (RewardFileError, ValueError) as exc:
        return None, f"diagnostics.json left out: {exc}"
    if not isinstance(data, dict) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) for v in data.values()
    ):
        return None, "diagnostics.json left out: not an object of numbers"
    return {str(k): float(v) for k, v in data.items()}, ""


class Evaluator(ABC):
    @abstractmethod
    def evaluate(self, task_dir: Path, workspace: Path) -> Evaluation:
        """Grade the preserved ``workspace`` with the task's grader; never raises for a grader's fault."""


class HarborVerifier(Evaluator):
    """Runs a Harbor task's ``tests/test.sh`` in a fresh sandbox of its own (see the module's docstring).

    ``bounds``: what of a workspace is graded at most (its files' apparent size, entries, depth); past them the
    workspace is not graded and scores 0 (``agent-disk``: the agent's output made it so). ``backend``: the
    sandbox backend (None: the selected one)."""

    def __init__(
        self, limits: SandboxLimits | None = None, *, bounds: CopyBounds | None = None, backend: str | None = None
    ) -> None:
        # The processes of a grading together get twice one process's address space, in resident memory.
        self.limits = limits or SandboxLimits(timeout_s=600.0, group_memory_mb=4096)
        self.limits.validate()  # the verifier's own limits are checked here: later, only a task's can be wrong
        self.bounds = bounds or CopyBounds()
        self.bounds.validate()
        self.backend = backend

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
            stage = Path(tempfile.mkdtemp(prefix="og-grade-"))
        except OSError as exc:
            return Evaluation(None, "sandbox", None, f"sandbox unavailable: {exc}")
        try:
            return self._grade(task_dir, workspace, stage, limits, env)
        finally:
            shutil.rmtree(stage, ignore_errors=True)

    def _grade(
        self, task_dir: Path, workspace: Path, stage: Path, limits: SandboxLimits, env: dict[str, str]
    ) -> Evaluation:
        # What the grader's sandbox mounts, staged outside it: the agent saw none of it, nor the stage's path.
        app, tests, logs = stage / "app", stage / "tests", stage / "logs"
        try:
            copied = copy_workspace(workspace, app, self.bounds, inside="/app")
        except WorkspaceTooLarge as exc:
            # The workspace is the agent's output: one over the bounds (a sparse file of 2 GiB costs no block of
            # its disk quota, 100k empty files none either) is its doing, scored 0; were it excluded, planting one
            # would be a way out of every negative.
            why = f"agent-disk: WorkspaceTooLarge: the workspace is over the grader's bounds, not graded: {exc}"
            return Evaluation(0.0, "agent-disk", None, why)
        except OSError as exc:
            return Evaluation(None, "sandbox", None, f"sandbox failed to copy the workspace {workspace}: {exc}")
        try:
            shutil.copytree(task_dir / "tests", tests, symlinks=True)
            (logs / "verifier").mkdir(parents=True)
            (logs / "agent").mkdir()
        except OSError as exc:  # shutil.Error too
            return Evaluation(None, "sandbox", None, f"sandbox failed to stage the tests: {exc}")
        mounts = [Mount(app, "/app", writable=True), Mount(tests, "/tests"), Mount(logs, "/logs", writable=True)]
        try:
            with LocalSandbox(limits, prefix="og-grader-", mounts=mounts, backend=self.backend) as sb:
                if sb.isolation in _HOST_VIEW:
                    raise SandboxError(
                        f"the {sb.isolation!r} sandbox shows the grader the host's paths, not /app, /tests and "
                        "/logs, and would run the code under test as the service's user, next to the data dir's "
                        "secrets and answer keys: grading needs the namespace backend (allow unprivileged user "
                        "namespaces) or the docker one (OPENGYRE_SANDBOX=docker for the services that grade); see "
                        "docs/sandbox.md"
                    )
                result = sb.run(["bash", "/tests/test.sh"], cwd="/app", env=env)
        except SandboxError as exc:
            return Evaluation(None, "sandbox", None, str(exc))
        skipped = ""
        if copied.skipped:  # said with the grade: a workspace that planted them should be visible as such
            skipped = f"; the copy left out {len(copied.skipped)}: {'; '.join(copied.skipped)[:500]}"
        if result.timed_out:
            why = f"agent-timeout: grading ran past its {limits.timeout_s:g} s: the solution under test hung"
            return Evaluation(0.0, "agent-timeout", result.exit_code, f"{why}; {_tail(result.output)}")
        if result.memory_exceeded:
            why = f"agent-oom: grading exceeded {limits.group_memory_mb} MB: the solution exhausted memory"
            return Evaluation(0.0, "agent-oom", result.exit_code, f"{why}; {_tail(result.output)}")
        if result.disk_exceeded:
            why = f"agent-disk: grading exceeded the disk quota of {limits.disk_mb} MB: the solution filled it"
            return Evaluation(0.0, "agent-disk", result.exit_code, f"{why}; {_tail(result.output)}")
        if result.signal is not None:
            return _killed(result.signal, result.oom_kills, result.exit_code, result.output)
        try:
            metrics = read_reward(logs / "verifier")
        except ValueError as exc:  # RewardFileError, a JSON or number that does not parse
            detail = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, RewardFileNotFoundError):
                detail = f"RewardFileNotFoundError: test.sh exited {result.exit_code}; {_tail(result.output)}"
            return Evaluation(None, "evaluator", result.exit_code, detail + skipped)
        reward = metrics.get("reward")
        if reward is None or not math.isfinite(reward):
            return Evaluation(None, "evaluator", result.exit_code, f"no finite 'reward' in {sorted(metrics)}")
        diagnostics, why = read_diagnostics(logs / "verifier")
        detail = "; ".join(x for x in (skipped.removeprefix("; "), why) if x)
        return Evaluation(reward, None, result.exit_code, detail, metrics, diagnostics)


def _killed(sig: int, oom_kills: int | None, exit_code: int, output: str) -> Evaluation:
    """The grader ended by a signal the sandbox did not send. The code under test runs as the grader's user in its
    sandbox, so it can kill its grader (after writing a reward of its own): unless the kernel counted an OOM kill
    while it ran (or cannot say), that is the agent's doing, scored 0, and the reward file is not read."""
    if sig == 9 and oom_kills != 0:
        why = "oom: the grader was killed by SIGKILL from outside the sandbox (the kernel counted an OOM kill)"
        return Evaluation(None, "oom", exit_code, f"{why}; {_tail(output)}")
    why = f"agent-killed: the grader was killed by signal {sig}, not by the sandbox nor the OOM killer"
    return Evaluation(0.0, "agent-killed", exit_code, f"{why}; {_tail(output)}")


def _tail(text: str, n: int = 2000) -> str:
    return text[-n:]
