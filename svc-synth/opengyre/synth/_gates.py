"""Validation gates: consistency, preconditions, reference = 1.0, no-op below the pass threshold, and a solution
that hangs, crashes or exhausts memory scoring 0 as the solver's fault (with the grader still giving a valid
score on the wreck it leaves). Every gate returns a verdict with its reason."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from opengyre.sandbox import LocalSandbox, Mount, SandboxError, SandboxLimits

from ._blueprint import Blueprint, fill_contract, load_blueprint, materials
from ._build import build_task, task_skill_files
from ._run import Outcome, RunLimits, run_solution

__all__ = ["GATES", "GateLimits", "Verdict", "validate_task"]

GATES = ("consistency", "preconditions", "reference", "noop", "hang", "crash", "oom")


@dataclass(frozen=True)
class Verdict:
    gate: str
    ok: bool
    reason: str


@dataclass(frozen=True)
class GateLimits:
    run: RunLimits = dataclasses.field(default_factory=RunLimits)
    hang_timeout_s: float = 2.0  # the hanging solution is cut here: it only has to be long enough to be a hang


_HANG = "mkdir -p answers; echo '{' > answers/c0.json; sleep 3600\n"
# Sabotage, then die by a signal: garbage in every answer and a symlink to /dev/zero, which a careless grader
# would read without end.
_CRASH = (
    "mkdir -p answers\nfor i in $(seq 0 20); do echo 'not json' > answers/c$i.json; done\n"
    "ln -sf /dev/zero answers/c0.json\nkill -SEGV $$\n"
)
_OOM = "python3 -c \"x = []\nwhile True: x.append(b'x' * (8 << 20))\"\n"


def _consistency(task_dir: Path, bp: Blueprint) -> Verdict:
    problems: list[str] = []
    try:
        bp.validate()
    except (ValueError, KeyError) as exc:
        return Verdict("consistency", False, f"blueprint invalid: {exc}")
    derived = fill_contract(bp)
    if derived.facts != bp.facts:
        problems.append("the blueprint's facts differ from what its challenges build")
    if derived.acceptance != bp.acceptance:
        problems.append("the blueprint's acceptance criteria differ from its challenges' rubric items")
    rubric = json.loads((task_dir / "tests" / "rubric.json").read_text())
    if msgspec.convert(rubric["items"], list[Any]) != msgspec.to_builtins(bp.acceptance):
        problems.append("tests/rubric.json is not the blueprint's acceptance criteria")
    cids = {c.cid for c in bp.challenges}
    for item in bp.acceptance:
        if item.challenge not in cids:
            problems.append(f"rubric item {item.id} checks no challenge of the blueprint")
        if not item.weight > 0:
            problems.append(f"rubric item {item.id} has weight {item.weight}")
    covered = {i.challenge for i in bp.acceptance}
    problems += [f"challenge {c} has no rubric item" for c in sorted(cids - covered)]
    try:
        built = build_task(bp, task_skill_files(task_dir, bp) if bp.skill_files else None)
    except ValueError as exc:  # the skill's files there are not the blueprint's
        return Verdict("consistency", False, "; ".join([*problems, str(exc)]))
    on_disk = {str(p.relative_to(task_dir)): p.read_bytes() for p in task_dir.rglob("*") if p.is_file()}
    if on_disk != built.files:
        problems.append("the task directory is not what the blueprint builds")
    instruction = built.files["instruction.md"].decode()
    for item in bp.acceptance:  # the instruction must not give away what is to be discovered or inferred
        if item.kind == "json_equals" and len(str(item.expected)) >= 4 and str(item.expected) in instruction:
            problems.append(f"the instruction leaks the answer of {item.id}")
    for rel in built.workspace:
        if rel.startswith("answers/"):
            problems.append(f"the initial workspace already holds {rel}")
    return Verdict("consistency", not problems, "; ".join(problems) or "blueprint, workspace and rubric agree")


def _preconditions(task_dir: Path, bp: Blueprint) -> Verdict:
    """Each challenge's preconditions on one copy of the initial workspace, at ``/app`` in a sandbox of its own
    (challenges live in folders of their own, so one's checks cannot disturb another's)."""
    failed: list[str] = []
    pres = [pre for _, m in materials(bp) for pre in m.preconditions]
    if not pres:
        return Verdict("preconditions", True, "no preconditions to check")
    try:
        with tempfile.TemporaryDirectory(prefix="og-synth-pre-ws-") as stage:
            app = Path(stage) / "app"
            shutil.copytree(task_dir / "environment" / "workspace", app, symlinks=True)
            limits = SandboxLimits(timeout_s=20.0, memory_mb=1024)
            with LocalSandbox(limits, prefix="og-synth-pre-", mounts=[Mount(app, "/app", writable=True)]) as sb:
                for pre in pres:
                    r = sb.run(pre.argv, cwd="/app")
                    if r.timed_out or (r.exit_code == 0) != (pre.expect_exit == "zero"):
                        failed.append(f"{pre.what}: exit {r.exit_code}")
    except SandboxError as exc:
        return Verdict("preconditions", False, f"sandbox: {exc}")
    except OSError as exc:
        return Verdict("preconditions", False, f"sandbox: cannot copy the workspace in: {exc}")
    return Verdict("preconditions", not failed, "; ".join(failed) or f"{len(pres)} precondition(s) hold")


def _score_gate(gate: str, o: Outcome, want: str) -> Verdict:
    return Verdict(gate, False, f"{want}; got {o.score} ({o.failure_class}: {o.detail[:300]})")


def _easy_challenges(bp: Blueprint, noop: Outcome) -> list[str]:
    """Challenges whose own items a no-op already passes: every challenge must be work, not just the task."""
    easy = []
    for c in bp.challenges:
        items = [i for i in bp.acceptance if i.challenge == c.cid and i.kind != "judge"]
        total = sum(i.weight for i in items)
        got = sum(i.weight * noop.diagnostics.get(f"item.{i.id}", 0.0) for i in items)
        if total and got / total >= bp.pass_threshold:
            easy.append(f"{c.cid} ({c.pattern_id})")
    return easy


def validate_task(task_dir: Path, limits: GateLimits | None = None) -> list[Verdict]:
    """Every gate's verdict, in ``GATES`` order (later gates still run when one fails: each reason is reported)."""
    limits = limits or GateLimits()
    task_dir = Path(task_dir)
    try:  # a tampered blueprint fails the gates: it must not crash the one that reads it first
        bp = load_blueprint((task_dir / "tests" / "blueprint.json").read_bytes())
        bp.validate()
    except (OSError, msgspec.DecodeError, msgspec.ValidationError, ValueError, KeyError) as exc:
        said = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc  # not the KeyError's quoted repr
        why = f"tests/blueprint.json is not a valid blueprint: {said}"
        return [Verdict("consistency", False, why)] + [
            Verdict(g, False, "not run: the blueprint is invalid") for g in GATES[1:]
        ]
    try:
        consistency = _consistency(task_dir, bp)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # rubric.json unreadable or not the shape we write
        consistency = Verdict("consistency", False, f"the task's files do not parse: {exc}")
    out = [consistency, _preconditions(task_dir, bp)]
    ref = run_solution(task_dir, 'bash "$SOLUTION_DIR/solve.sh"\n', limits.run)
    out.append(
        Verdict("reference", True, "reference scores 1.0")
        if ref.score == 1.0
        else _score_gate("reference", ref, "reference must score 1.0")
    )
    noop = run_solution(task_dir, None, limits.run)
    easy = _easy_challenges(bp, noop)
    if noop.score is not None and noop.score < bp.pass_threshold and not easy:
        out.append(
            Verdict("noop", True, f"doing nothing scores {noop.score} < {bp.pass_threshold}, on every challenge")
        )
    elif easy:
        out.append(Verdict("noop", False, f"doing nothing passes challenge(s) {', '.join(easy)}"))
    else:
        out.append(_score_gate("noop", noop, f"doing nothing must score below {bp.pass_threshold}"))
    hang_limits = dataclasses.replace(
        limits.run, solve=dataclasses.replace(limits.run.solve, timeout_s=limits.hang_timeout_s)
    )
    # The memory gate needs only to cross a limit, not a large one: a small group limit keeps it cheap.
    oom_limits = dataclasses.replace(
        limits.run,
        solve=dataclasses.replace(limits.run.solve, group_memory_mb=min(64, limits.run.solve.group_memory_mb or 64)),
    )
    for gate, script, cls, run_limits in (
        ("hang", _HANG, "agent-timeout", hang_limits),
        ("crash", _CRASH, "agent-crash", limits.run),
        ("oom", _OOM, "agent-oom", oom_limits),
    ):
        o = run_solution(task_dir, script, run_limits, grade_faults=gate == "crash")
        if not (o.score == 0.0 and o.failure_class == cls):
            out.append(_score_gate(gate, o, f"must score 0 as {cls}"))
        elif gate == "crash" and not (o.metrics.get("grader_valid") and o.metrics["reward"] < bp.pass_threshold):
            out.append(Verdict(gate, False, f"the grader must give a valid low score on the wreck; got {o.metrics}"))
        else:
            out.append(Verdict(gate, True, f"scores 0 as the solver's fault ({cls})"))
    return out
