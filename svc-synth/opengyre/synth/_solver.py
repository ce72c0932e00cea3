"""A scripted solver that takes the shortcuts a weak model takes, for measuring and testing the hardening loop.

Per challenge it first reads only the first evidence file. At a challenge's easiest level that shortcut works
(the evidence is concentrated); above it, it persists (reads every evidence file, one turn each, and solves)
with a probability that falls with the level, and otherwise gives up on the challenge. What it solves is the
reference solution's part for that challenge, run in the sandbox and graded by the task's real verifier; its
actions are recorded as the tool calls a proxy would record.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from ._blueprint import load_blueprint, materials
from ._catalogue import get_pattern
from ._run import Outcome, RunLimits, run_solution

__all__ = ["ShortcutSolver", "SolverRun"]

_RUN = """python3 - "$SOLUTION_DIR/solve.py" {cids} <<'PY'
import re, sys
src = re.sub(r"^_c\\d+\\(\\)$", "", open(sys.argv[1]).read(), flags=re.M)
ns = {{}}
exec(compile(src, "solve.py", "exec"), ns)
for c in sys.argv[2:]:
    ns["_" + c]()
PY
"""


@dataclass(frozen=True)
class SolverRun:
    outcome: Outcome
    actions: list[str]  # tool-call arguments (JSON), in order

    @property
    def turns(self) -> int:
        return len(self.actions)


class ShortcutSolver:
    def __init__(self, persist: float = 0.85, decay: float = 0.5, limits: RunLimits | None = None) -> None:
        self.persist, self.decay = persist, decay
        self.limits = limits or RunLimits()

    def solve(self, task_dir: Path, seed: str) -> SolverRun:
        task_dir = Path(task_dir)
        bp = load_blueprint((task_dir / "tests" / "blueprint.json").read_bytes())
        rng = random.Random(seed)
        actions: list[str] = [json.dumps({"command": "ls -R"})]
        solved: list[str] = []
        for c, m in materials(bp):
            p = get_pattern(c.pattern_id)
            level = p.knobs[p.primary].index(c.knobs[p.primary])
            if m.evidence:
                actions.append(json.dumps({"command": f"cat {m.evidence[0]}"}))
            if level == 0:
                solved.append(c.cid)  # the shortcut suffices: the evidence sits where it looked first
            elif rng.random() < self.persist * self.decay ** (level - 1):
                actions += [json.dumps({"command": f"cat {e}"}) for e in m.evidence[1:]]
                actions.append(json.dumps({"command": f"python3 work_{c.cid}.py"}))
                solved.append(c.cid)
        script = _RUN.format(cids=" ".join(solved)) if solved else "true\n"
        return SolverRun(run_solution(task_dir, script, self.limits), actions)
