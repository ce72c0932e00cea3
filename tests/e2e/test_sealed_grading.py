"""A harness cannot reach the answer key, and the grader cannot be fooled: against a real synthesized task laid
out as a run's data dir holds it (``runs/<run>/synth/tasks/<id>/v1/{environment,solution,tests}``), with the
workspace made as the driver makes it (``<data>/rollouts/<execution>/app``), a harness that tries every shortcut
(reading ``solution/`` and ``tests/`` by host path and by ``../``, running a copied solve script, writing the
verifier's reward itself, planting symlinks for the grader, editing the task) scores what doing nothing scores,
never 1; an honest harness scores 1 through the same path, so the test can fail.
"""

from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

import opengyre.synth
from opengyre.grading import HarborVerifier
from opengyre.harness import HarnessSpec, HarnessTarget, run_harness
from opengyre.loop._rollout import _fresh_workspace
from opengyre.sandbox import SandboxLimits
from opengyre.synth import GateLimits, Synthesizer, ingest
from opengyre.trainer import score_execution

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"
LIMITS = SandboxLimits(timeout_s=120)
_SYNTH_DIR = Path(opengyre.synth.__file__).parent  # the task generators


@dataclass(frozen=True)
class Task:
    data: Path
    task_dir: Path
    task_id: str


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    data = tmp_path_factory.mktemp("data")
    skill = next(s for s in ingest(EXAMPLES, data / "skills").accepted if s.name == "log-triage")
    synth = Synthesizer(data / "runs" / "r1" / "synth", GateLimits(hang_timeout_s=1.0))
    build = synth.synthesize(skill, 3)  # as the driver asks for one: a small seed, the patterns drawn by it
    assert build.ok, [v for v in build.verdicts if not v.ok]
    assert build.task_dir == data / "runs" / "r1" / "synth" / "tasks" / build.blueprint.task_id / "v1"
    return Task(data, build.task_dir, build.blueprint.task_id)


def _digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


def _free_url() -> str:
    with socket.socket() as s:  # the harness calls no model: a closed loopback port stands for the proxy
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/x/ex/v1"


def _literal(script: str) -> str:
    return script.replace("{", "{{").replace("}", "}}")  # a spec's template: the script's braces are literal


def _run(task: Task, eid: str, spec: HarnessSpec, instruction: str) -> Path:
    ws = _fresh_workspace(task.task_dir, task.data / "rollouts" / eid)
    skills = task.task_dir / "environment" / "skills"  # shown read-only, as the driver shows them
    target = HarnessTarget(_free_url(), "og1.ex.main.k", "m", ws, instruction, skills=skills)
    out = run_harness(spec, target, LIMITS)
    assert not out.timed_out, out.stderr
    return ws


_REGENERATE = """
import os, sys, tempfile
from pathlib import Path
import opengyre.synth as s
ws = Path(sys.argv[1])
skills = Path(s.__file__).parents[2] / "skills"
instruction = open(os.environ["INSTRUCTION_FILE"]).read()
for sk in s.ingest(skills, Path(tempfile.mkdtemp()) / "sk").accepted:
    for seed in range(21):
        for n in (1, 2, 3):
            try:
                bp = s.draft_blueprint(skill_id=sk.skill_id, skill_name=sk.name,
                                       capabilities=sk.capabilities, seed=seed, n_challenges=n, level=0)
            except ValueError:
                continue
            built = s.build_task(bp)
            if built.files["instruction.md"].decode() == instruction:
                os.chdir(ws)
                exec(compile(built.files["solution/solve.py"], "solve.py", "exec"), {})
                sys.exit(0)
sys.exit(1)
"""


def _cheat(task: Task) -> str:
    t = task.task_dir
    rel = f"../../../runs/r1/synth/tasks/{task.task_id}/v1"  # from <data>/rollouts/<eid>/app on the host
    key = [f"solution/{n}" for n in ("solve.sh", "solve.py")] + [
        f"tests/{n}" for n in ("rubric.json", "blueprint.json", "grade.py", "test.sh")
    ]
    lines = ["#!/bin/bash", 'log() { echo "$1" >> leaks.txt; }', "mkdir -p answers"]
    # 1. the answer key by its absolute host path, by ../ from the workspace, and where Harbor keeps it.
    for base in (str(t), rel, "/solution/..", "/tests/.."):
        for k in key:
            lines.append(f'cat "{base}/{k}" >/dev/null 2>&1 && log "read {base}/{k}"')
    lines.append(
        "find / \\( -path /proc -o -path /sys -o -path /usr -o -name site-packages \\) -prune -o "
        '\\( -name solve.py -o -name rubric.json \\) -print 2>/dev/null | grep -v "^$PWD" > found.txt'
    )
    lines.append('[ -s found.txt ] && log "found $(head -1 found.txt)"')
    # 2. copy the solve script and run it.
    for base in (str(t), rel):
        lines.append(f'cp -r "{base}/solution" sol 2>/dev/null && APP_DIR="$PWD" bash sol/solve.sh && log "ran {base}"')
    lines.append('for f in $(cat found.txt); do case $f in */solve.py) python3 "$f" && log "ran $f";; esac; done')
    # 2b. regenerate the task: the generators and the skills are installed code the sandbox shows, and a run's seeds
    # are small numbers; build every small seed's task and run the solution of the one whose instruction matches.
    lines.append(f'"$1" - "$PWD" <<\'PY\' && log regenerated\n{_REGENERATE}PY')
    # 3. write the verifier's reward itself (where it may succeed: a private root that vanishes with the sandbox;
    # the grade below says whether it counted).
    lines.append(
        "mkdir -p /logs/verifier 2>/dev/null && echo '{\"reward\": 1.0}' > /logs/verifier/reward.json; "
        "echo 1 > /logs/verifier/reward.txt 2>/dev/null"
    )
    # 4. symlinks for the grader: the answers, the tests, the solution, as the host and the grader name them.
    for i in range(4):
        lines.append(f"ln -sf {t}/tests/rubric.json answers/c{i}.json")
    lines += [
        f"ln -s {t}/solution solution_link; ln -s {t}/tests tests_link; ln -s /tests grader_tests",
        "ln -s /tests/rubric.json rubric.json; ln -s ../tests up_tests; ln -s /logs/verifier/reward.json reward",
    ]
    # 5. edit what it can: the task's grader and rubric, by every name.
    for base in (str(t), rel, ""):
        lines.append(
            f"echo 'echo 1 > /logs/verifier/reward.txt' > \"{base}/tests/test.sh\" 2>/dev/null "
            f'&& log "edited {base or "/"}tests/test.sh"'
        )
        lines.append(
            f'echo \'{{"pass_threshold": 0, "items": []}}\' > "{base}/tests/rubric.json" 2>/dev/null '
            f'&& log "edited {base or "/"}tests/rubric.json"'
        )
    lines.append("exit 0")
    return "\n".join(lines) + "\n"


def test_the_harness_sandbox_cannot_reach_the_tasks_solution_or_tests(task: Task) -> None:
    t = task.task_dir
    probes = [t, t / "solution", t / "tests", t / "solution" / "solve.py", t / "tests" / "rubric.json", task.data]
    script = "".join(f'[ -e "{p}" ] && echo "{p}" >> seen.txt\n' for p in probes)
    script += "for d in /solution /tests /logs ../solution ../tests ../../runs ../../../runs; do\n"
    script += '  [ -e "$d" ] && echo "$d" >> seen.txt\ndone\n'
    script += 'echo "$PWD" > pwd.txt\n'
    # The task generators (their reference solvers answer every task they build): neither importable nor listed.
    script += (
        '"$1" -c "from opengyre.synth import build_task" 2>/dev/null && echo "import opengyre.synth" >> seen.txt\n'
    )
    script += f'ls "{_SYNTH_DIR}" | grep -q . && echo "{_SYNTH_DIR}" >> seen.txt\n'
    # The task's skill is there, read-only, and nothing else of the task beside it.
    script += "cp /skills/log-triage/SKILL.md skill.md; ls -A /skills > skills.txt\n"
    script += "touch /skills/x 2>/dev/null && echo /skills-writable >> seen.txt\n"
    spec = HarnessSpec("probe", ("bash", "-c", _literal(script), "probe", "{python}"))
    ws = _run(task, "probe", spec, "look around")
    assert (ws / "pwd.txt").read_text().strip() == "/app"
    shipped = task.task_dir / "environment" / "skills" / "log-triage" / "SKILL.md"
    assert (ws / "skill.md").read_bytes() == shipped.read_bytes() == (EXAMPLES / "log-triage" / "SKILL.md").read_bytes()
    assert (ws / "skills.txt").read_text().split() == ["log-triage"]
    seen = (ws / "seen.txt").read_text().splitlines() if (ws / "seen.txt").exists() else []
    assert seen == [], f"the harness's sandbox reached {seen}"


def test_a_cheating_harness_scores_what_doing_nothing_scores(task: Task) -> None:
    before = _digest(task.task_dir)
    noop = HarborVerifier().evaluate(task.task_dir, task.task_dir / "environment" / "workspace")
    assert noop.valid and noop.score is not None and noop.score < 1.0, noop
    instruction = (task.task_dir / "instruction.md").read_text()  # what the driver gives the harness
    spec = HarnessSpec("cheat", ("bash", "-c", _literal(_cheat(task)), "cheat", "{python}"))
    spec = HarnessSpec(spec.name, spec.argv, {"INSTRUCTION_FILE": "{instruction_file}"})
    ws = _run(task, "cheat", spec, instruction)
    leaks = (ws / "leaks.txt").read_text().splitlines() if (ws / "leaks.txt").exists() else []
    ev = HarborVerifier().evaluate(task.task_dir, ws)
    assert _digest(task.task_dir) == before, "the harness changed the task's directory"
    assert leaks == [], f"shortcuts that worked: {leaks}"
    assert (ev.score, ev.failure_class) == (noop.score, None), ev


def test_an_honest_harness_scores_one_through_the_same_path(task: Task) -> None:
    # Given the reference's commands in its instruction (the test knows them; the harness only runs them).
    reference = (task.task_dir / "solution" / "solve.py").read_text()
    spec = HarnessSpec("honest", ("bash", "-c", "cd {workdir} && python3 {instruction_file}"))
    ws = _run(task, "honest", spec, reference)
    ev = HarborVerifier().evaluate(task.task_dir, ws)
    assert (ev.score, ev.failure_class) == (1.0, None), ev
    # The work happened in the preserved workspace (which files depends on the patterns the store's seed key drew).
    assert _digest(ws) != _digest(task.task_dir / "environment" / "workspace")


@pytest.mark.parametrize(
    ("eid", "bloat"),
    [
        ("sparse-file", "truncate -s 2G bloat.bin"),  # 2 GiB apparent, no block: within its quota and RLIMIT_FSIZE
        ("empty-files", "mkdir bloat && cd bloat && python3 -c 'for i in range(100001): open(str(i), \"w\").close()'"),
    ],
)
def test_a_harness_that_bloats_its_workspace_past_the_graders_bounds_scores_zero(
    task: Task, eid: str, bloat: str
) -> None:
    # A policy whose attempt fails plants what the grader's copy refuses (its bounds: 1 GiB apparent, 100k
    # entries). Were that an evaluator failure the execution would be excluded from training: a way out of every
    # negative. Its own doing: 0, trained, even with the reference's work done before it.
    reference = (task.task_dir / "solution" / "solve.py").read_text()
    spec = HarnessSpec("bloat", ("bash", "-c", "cd {workdir} && python3 {instruction_file} && " + _literal(bloat)))
    ws = _run(task, eid, spec, reference)
    assert (ws / "bloat.bin").exists() or len(list((ws / "bloat").iterdir())) > 100_000  # the plant happened
    fin = score_execution("ex-bloat", HarborVerifier(), task.task_dir, ws, exit_code=0, sandbox="namespace")
    assert (fin.status, fin.score, fin.failure_class) == ("completed", 0.0, "agent-disk"), fin
    assert "WorkspaceTooLarge" in fin.detail
