"""Run a solution against a task in the sandbox, then grade the workspace with the trainer's Harbor verifier.

The solution runs in a sandbox of its own with the task's paths as Harbor gives them: ``/app`` a copy of the
initial workspace (writable, its working directory), ``/solution`` the task's solution (read-only);
``$APP_DIR`` and ``$SOLUTION_DIR`` are those paths, never the host's. The grader then runs apart, in the
verifier's own fresh sandbox, on what the solution left in ``/app``; ``/tests`` is never visible to the solution.

A task that needs a container the host sandbox cannot give (``_harbor_rules.container_needs``: a Dockerfile that
builds something, a separate verifier, several steps) is refused with the reasons (``needs-container``, no
score), never run without it and scored.

A solution that hangs, exhausts memory or crashes (killed by a signal) scores 0 and the outcome names it as the
solver's fault (``agent-timeout``, ``agent-oom``, ``agent-crash``): neither an evaluator nor an infrastructure
failure. Otherwise the preserved workspace is graded whatever the solution's exit status was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path

from opengyre.grading import HarborVerifier
from opengyre.harness import SKILLS_DIR
from opengyre.sandbox import LocalSandbox, Mount, SandboxError, SandboxLimits

from ._harbor_rules import container_needs

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
    diagnostics: dict[str, float] = dataclasses.field(default_factory=dict)  # diagnostics.json: item.<id>, ...

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
    """``solve_sh``: a bash script run in the workspace, ``/app`` (``None``: do nothing). The task's
    ``solution/`` folder is available to it read-only at ``/solution`` (``$SOLUTION_DIR``). ``grade_faults``:
    grade the wreck a faulty solution left too (the score stays 0; ``metrics`` then holds the grader's, with
    ``grader_valid`` 1 or 0), which checks that the grader itself copes with whatever a dying solution leaves
    behind."""
    limits = limits or RunLimits()
    task_dir = Path(task_dir)
    needs = _needs(task_dir)
    if needs:  # run here it would be run wrongly (without its image, its verifier, its steps): refused, unscored
        return Outcome(None, "needs-container", f"the host sandbox cannot run this task: {'; '.join(needs)}")
    ws = task_dir / "environment" / "workspace"
    if solve_sh is None:
        # Nothing runs before the grader, and the verifier grades a copy in its own sandbox: the initial
        # workspace is graded as it is, without a solve sandbox around it (one copy and one tree removal fewer).
        ev = HarborVerifier(limits.grade).evaluate(task_dir, ws)
        kept = (_snapshot(ws) if ws.is_dir() else {}) if keep_workspace else None
        return Outcome(
            ev.score, ev.failure_class, ev.detail, dict(ev.metrics or {}), None, kept, dict(ev.diagnostics or {})
        )
    try:
        stage = Path(tempfile.mkdtemp(prefix="og-synth-ws-"))
    except OSError as exc:
        return Outcome(None, "sandbox", f"sandbox unavailable: {exc}")
    try:
        app = stage / "app"
        try:
            shutil.copytree(ws, app, symlinks=True) if ws.is_dir() else app.mkdir()
        except OSError as exc:  # shutil.Error too
            return Outcome(None, "sandbox", f"sandbox failed to copy the workspace in: {exc}")
        mounts = [Mount(app, "/app", writable=True)]
        if (task_dir / "solution").is_dir():
            mounts.append(Mount(task_dir / "solution", "/solution"))
        skills = task_dir / "environment" / "skills"  # the task's skills, where its Dockerfile copies them
        if skills.is_dir() and not skills.is_symlink() and not skills.parent.is_symlink():  # a link: not followed
            mounts.append(Mount(skills, SKILLS_DIR))
        with LocalSandbox(limits.solve, prefix="og-synth-", mounts=mounts) as sb:
            env = {"APP_DIR": "/app", "SOLUTION_DIR": "/solution"}
            r = sb.run(["bash", "-c", solve_sh], cwd="/app", env=env)
        code = r.exit_code
        if r.timed_out:
            return Outcome(0.0, "agent-timeout", f"the solution ran past {limits.solve.timeout_s:g} s", {}, code)
        if r.memory_exceeded:
            return Outcome(0.0, "agent-oom", f"the solution exceeded {limits.solve.group_memory_mb} MB", {}, code)
        if r.signal is not None or code > 128:
            wreck: dict[str, float] = {}
            if grade_faults:
                ev = HarborVerifier(limits.grade).evaluate(task_dir, app)
                wreck = {**(ev.metrics or {}), "grader_valid": float(ev.valid)}
            return Outcome(0.0, "agent-crash", f"the solution died by signal ({code})", wreck, code)
        ev = HarborVerifier(limits.grade).evaluate(task_dir, app)
        kept = _snapshot(app) if keep_workspace else None
        return Outcome(
            ev.score, ev.failure_class, ev.detail, dict(ev.metrics or {}), code, kept, dict(ev.diagnostics or {})
        )
    except SandboxError as exc:
        return Outcome(None, "sandbox", str(exc))
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _needs(task_dir: Path) -> tuple[str, ...]:
    try:
        conf = tomllib.loads((task_dir / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return ()  # no or a bad task.toml: the verifier says so, as an evaluator failure
    return container_needs(task_dir, conf)


_SNAPSHOT_FILE_LIMIT = 1 << 20


def _snapshot(root: Path) -> dict[str, bytes]:
    """The workspace's regular files of at most 1 MiB (what a solution left: no symlink followed, no FIFO opened)."""
    out = {}
    for folder, dirs, files in os.walk(root):  # os.walk does not descend into symlinked directories
        dirs.sort()
        for name in sorted(files):
            p = Path(folder) / name
            with contextlib.suppress(OSError):
                fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
                try:
                    st = os.fstat(fd)
                    if stat.S_ISREG(st.st_mode) and st.st_size <= _SNAPSHOT_FILE_LIMIT:
                        out[str(p.relative_to(root))] = os.read(fd, _SNAPSHOT_FILE_LIMIT)
                finally:
                    os.close(fd)
    return dict(sorted(out.items()))
