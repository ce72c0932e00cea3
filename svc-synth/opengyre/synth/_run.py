"""Run a solution against a task in the sandbox, then grade the workspace with the trainer's Harbor verifier.

A solution that hangs, exhausts memory or crashes (killed by a signal) scores 0 and the outcome names it as the
solver's fault (``agent-timeout``, ``agent-oom``, ``agent-crash``): neither an evaluator nor an infrastructure
failure. Otherwise the preserved workspace is graded whatever the solution's exit status was.
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from opengyre.sandbox import LocalSandbox, SandboxError, SandboxLimits
from opengyre.trainer import HarborVerifier

__all__ = ["Outcome", "RunLimits", "run_solution"]


@dataclass(frozen=True)
class RunLimits:
    solve: SandboxLimits = dataclasses.field(
        default_factory=lambda: SandboxLimits(timeout_s=30.0, memory_mb=1024, group_memory_mb=256)
    )
    grade: SandboxLimits = dataclasses.field(
        default_factory=lambda: SandboxLimits(timeout_s=30.0, memory_mb=1024, group_memory_mb=512)
    )


@dataclass(frozen=True)
class Outcome:
    score: float | None
    failure_class: str | None = None
    detail: str = ""
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    solve_exit: int | None = None
    workspace: dict[str, bytes] | None = None  # the graded workspace, when asked for

    @property
    def valid(self) -> bool:
        return self.score is not None


def run_solution(
    task_dir: Path,
    solve_sh: str | None,
    limits: RunLimits | None = None,
    *,
    keep_workspace: bool = False,
    grade_faults: bool = False,
) -> Outcome:
    """``solve_sh``: a bash script run in the workspace (``None``: do nothing). The task's ``solution/`` folder is
    available to it as ``$SOLUTION_DIR``. ``grade_faults``: grade the wreck a faulty solution left too (the
    score stays 0; ``metrics`` then holds the grader's, with ``grader_valid`` 1 or 0), which checks that the
    grader itself copes with whatever a dying solution leaves behind."""
    limits = limits or RunLimits()
    task_dir = Path(task_dir)
    if solve_sh is None:
        # Nothing runs before the grader, and the verifier grades a copy in its own sandbox: the initial
        # workspace is graded as it is, without a solve sandbox around it (one copy and one tree removal fewer).
        ws = task_dir / "environment" / "workspace"
        ev = HarborVerifier(limits.grade).evaluate(task_dir, ws)
        kept = (_snapshot(ws) if ws.is_dir() else {}) if keep_workspace else None
        return Outcome(ev.score, ev.failure_class, ev.detail, dict(ev.metrics or {}), None, kept)
    try:
        with LocalSandbox(limits.solve, prefix="og-synth-") as sb:
            app = sb.root / "app"
            ws = task_dir / "environment" / "workspace"
            sb.copy_in(ws, "app") if ws.is_dir() else app.mkdir()
            code = None
            if solve_sh is not None:
                sb.copy_in(task_dir / "solution", "solution") if (task_dir / "solution").is_dir() else None
                script = sb.root / "run_solution.sh"
                script.write_text(solve_sh)
                env = {"APP_DIR": str(app), "SOLUTION_DIR": str(sb.root / "solution")}
                r = sb.run(["bash", str(script)], cwd="app", env=env)
                code = r.exit_code
                if r.timed_out:
                    return Outcome(
                        0.0, "agent-timeout", f"the solution ran past {limits.solve.timeout_s:g} s", {}, code
                    )
                if r.memory_exceeded:
                    return Outcome(
                        0.0, "agent-oom", f"the solution exceeded {limits.solve.group_memory_mb} MB", {}, code
                    )
                if r.signal is not None or code > 128:
                    wreck: dict[str, float] = {}
                    if grade_faults:
                        ev = HarborVerifier(limits.grade).evaluate(task_dir, app)
                        wreck = {**(ev.metrics or {}), "grader_valid": float(ev.valid)}
                    return Outcome(0.0, "agent-crash", f"the solution died by signal ({code})", wreck, code)
            ev = HarborVerifier(limits.grade).evaluate(task_dir, app)
            kept = _snapshot(app) if keep_workspace else None
            return Outcome(ev.score, ev.failure_class, ev.detail, dict(ev.metrics or {}), code, kept)
    except SandboxError as exc:
        return Outcome(None, "sandbox", str(exc))


def _snapshot(root: Path) -> dict[str, bytes]:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


def copy_task(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, symlinks=True)
