"""The scripted oracle's kit: what the e2e tests hand their harness on purpose, so it runs in the default
(namespace) sandbox like any harness, with the data dir out of its reach.

The test owns the synth store's seed key (``<data>/synth/seed.key``, written before the stack starts, as an
operator would), so it builds the very tasks the run will build — the same skills, seeds, challenges and level —
without their gates, and keeps a copy of each reference solution keyed by the SHA-256 of its instruction. The kit
(the oracle script and those answers) is mounted read-only at ``/opt/oracle``; the host paths of the run's own
reference solutions in the data dir are the oracle's probes, which it must fail to open.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from opengyre.harness import HarnessSpec
from opengyre.synth import Synthesizer, build_task, ingest

HERE = Path(__file__).resolve().parent
INSIDE = "/opt/oracle"


@dataclass(frozen=True)
class OracleKit:
    root: Path  # the test-owned directory mounted at INSIDE
    probes: tuple[Path, ...]  # the run's reference solutions in the data dir: the oracle must not read them
    # Each task's instruction -> its reference solution's files (solve.sh and what it runs), by path under solution/.
    solutions: dict[str, dict[str, str]] = field(default_factory=dict)

    def argv(self, solved: int, faults: dict[int, str] | None = None) -> list[str]:
        extra = [a for i, kind in (faults or {}).items() for a in ("--fault", f"{i}:{kind}")]
        probes = [a for p in self.probes for a in ("--probe", str(p))]
        return [
            "{python}", f"{INSIDE}/_solver_harness.py", "--answers", f"{INSIDE}/answers", *probes,
            "--solved", str(solved), "--model", "{model}", "--instruction-file", "{instruction_file}",
            "--summary-file", "{summary_file}", *extra,
        ]  # fmt: skip

    @property
    def mounts(self) -> dict[str, str]:
        return {str(self.root): INSIDE}

    def spec(self, solved: int, faults: dict[int, str] | None = None) -> HarnessSpec:
        env = {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"}
        return HarnessSpec("scripted-solver", tuple(self.argv(solved, faults)), env, self.mounts)


def oracle_kit(
    tmp: Path, data: Path, skills: Path, skill_names: list[str], *, tasks_per_skill: int = 1, seed: int = 0,
    challenges: int = 1, level: int = 0,
) -> OracleKit:  # fmt: skip
    """The kit for a run on ``data`` building ``tasks_per_skill`` tasks of each named skill (the run's settings)."""
    root = tmp / "oracle"
    (root / "answers").mkdir(parents=True)
    shutil.copy(HERE / "_solver_harness.py", root / "_solver_harness.py")
    store = Synthesizer(data / "synth")  # makes the store's seed key: the service will read the same one
    report = ingest(skills, tmp / "oracle-skills")
    chosen = [s for s in report.accepted if s.name in skill_names]
    assert {s.name for s in chosen} == set(skill_names), report
    probes = []
    solutions: dict[str, dict[str, str]] = {}
    for skill in chosen:
        for i in range(tasks_per_skill):
            # The very blueprint and skill files the run's synth service will build (its draft, no gates).
            bp, files = store.draft(skill, seed + i, n_challenges=challenges, level=level)
            built = build_task(bp, files)
            answer = root / "answers" / hashlib.sha256(built.files["instruction.md"]).hexdigest()
            for rel, body in built.files.items():
                if rel.startswith("solution/"):
                    path = answer / rel.removeprefix("solution/")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_bytes(body)
            probes.append(store.task_dir(bp.task_id, bp.version) / "solution" / "solve.sh")
            solutions[built.files["instruction.md"].decode()] = {
                rel.removeprefix("solution/"): body.decode()
                for rel, body in built.files.items()
                if rel.startswith("solution/")
            }
    return OracleKit(root, tuple(probes), solutions)
