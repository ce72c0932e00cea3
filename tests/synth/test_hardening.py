"""The hardening loop: a solver that takes shortcuts makes a task too easy; the diagnosis finds the bypassed pattern
instance, the next version raises its knob and passes the gates; lineage is queryable; rebuild equals live; the
solver that scored on v1 scores less on the v2 the loop built."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import msgspec
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import (
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TaskHardened,
    ToolCallPayload,
)
from opengyre.projection import ProjectionRunner, dump_rows, replay_into
from opengyre.store import create_db_engine, migrate
from opengyre.synth import (
    Diagnosis,
    GateLimits,
    HardeningProjection,
    ShortcutSolver,
    Synthesizer,
    TasksProjection,
    diagnose,
    get_pattern,
    ingest,
    materials,
    procedural_goal,
    propose,
    run_solution,
    task_lineage,
    task_skill_files,
)
from tests._polling import await_until

from ._blueprints import sparse_and_distributed

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def test_the_diagnosis_finds_the_bypassed_instance_and_the_proposal_raises_it() -> None:
    bp = sparse_and_distributed(4)
    (_, m0), (_, m1) = materials(bp)
    # Every trajectory read the log, but only one of the four sources.
    trajs = [[f"cat {m0.evidence[0]}", f"cat {m1.evidence[0]}"]] * 3
    d = diagnose(bp, trajs)
    assert (d.cid, d.pattern_id, d.coverage) == ("c1", "distributed-evidence", 0.25)
    nxt, why = propose(bp, d)
    assert nxt.version == 2 and nxt.parent_version == 1 and nxt.challenges[1].knobs == {"sources": 6}
    assert "sources 4 -> 6" in why
    top, why = propose(
        sparse_and_distributed(6), diagnose(sparse_and_distributed(6), trajs)
    )  # at its top level: a compatible pattern joins
    assert len(top.challenges) == 3 and why.startswith("add c2")


def _recorded(ex: str, task_id: str, version: int, actions: list[str], score: float | None) -> list[Event]:
    """The scheduler's and the proxy's events, as they would record one run of a solver."""
    calls = [ToolCallPayload(id=f"t{k}", name="bash", arguments=a) for k, a in enumerate(actions)]
    return [
        ExecutionDispatched(execution_id=ex, task_id=task_id, group_id="g", task_version=version),
        *[ModelCallRecorded(execution_id=ex, call_id=f"{ex}-{k}", tool_calls=[c]) for k, c in enumerate(calls)],
        ExecutionFinished(execution_id=ex, status="completed", score=score),
    ]


async def _fold(runners: list[ProjectionRunner], stop: asyncio.Event) -> list[asyncio.Task[None]]:
    return [asyncio.create_task(r.run(stop)) for r in runners]


async def test_a_too_easy_task_is_hardened_and_rebuild_equals_live(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "log-triage")
    synth = Synthesizer(tmp_path / "store", GateLimits(hang_timeout_s=1.0))
    build = await asyncio.to_thread(synth.synthesize, skill, 3, patterns=["sparse-signal", "distributed-evidence"])
    assert build.ok, [v for v in build.verdicts if not v.ok]
    await event_log.append_many(build.events)

    hardening = HardeningProjection(window=2)
    runners = [ProjectionRunner(TasksProjection(), event_log, engine), ProjectionRunner(hardening, event_log, engine)]
    stop = asyncio.Event()
    tasks = await _fold(runners, stop)
    try:
        solver = ShortcutSolver()
        trajectories = []
        for i in range(2):
            run = await asyncio.to_thread(solver.solve, build.task_dir, f"run{i}")
            assert run.outcome.score == 1.0  # level 0: the shortcut works
            trajectories.append(run.actions)
            await event_log.append_many(_recorded(f"ex{i}", build.blueprint.task_id, 1, run.actions, run.outcome.score))
        await await_until(lambda: synth.pending(engine), "the version is flagged too easy")
        ((task_id, version),) = synth.pending(engine)
        # An earlier attempt of this step built v2 from another diagnosis (a model's, or before more runs came in)
        # and stopped before its events were in the log: the retry takes that v2, where proposing its own would
        # be refused by the directory the first build holds.
        v1 = build.blueprint
        d = diagnose(v1, trajectories)
        other = next(c for c in v1.challenges if c.cid != d.cid)
        earlier, _ = propose(v1, Diagnosis(other.cid, other.pattern_id, 0.0, "an earlier attempt's diagnosis"))
        skill_files = task_skill_files(build.task_dir, v1)
        assert (await asyncio.to_thread(synth.build_and_validate, earlier, skill_files)).ok
        events = await asyncio.to_thread(synth.harden, engine, task_id, version, hardening)
        assert [e.type_name() for e in events] == ["task-too-easy", "task-hardened", "task-validated"]
        hardened = events[1]
        assert isinstance(hardened, TaskHardened) and hardened.to_version == 2
        assert hardened.blueprint == msgspec.to_builtins(earlier) and hardened.bypassed == other.cid
        assert hardened.reason.startswith("the version an earlier attempt of this step built")
        # v2 ships the skill v1 shipped
        shipped = Path(hardened.task_dir) / "environment" / "skills" / skill.name / "SKILL.md"
        assert shipped.read_bytes() == (skill.path / "SKILL.md").read_bytes()
        await event_log.append_many(events)
        await event_log.append_many(events)  # a repeated step appends nothing twice (ids derive from the version)
        for r in runners:
            await r.wait_caught_up(60)
    finally:
        stop.set()
        await asyncio.gather(*tasks)

    with engine.connect() as conn:
        lineage = task_lineage(conn, task_id)
    assert [(v.version, v.parent_version, v.validated) for v in lineage] == [(1, None, True), (2, 1, True)]
    knobs = [json.loads(v.patterns) for v in lineage]
    assert knobs[0] != knobs[1]  # the bypassed instance's knob went up
    assert json.loads(lineage[1].checks)["reference"] == "reference scores 1.0"
    assert not synth.pending(engine)

    other = create_db_engine(f"sqlite:///{tmp_path / 'rebuilt.db'}")
    migrate(other)
    for p in (TasksProjection(), HardeningProjection(window=2)):
        await replay_into(p, event_log, other)
        assert dump_rows(other, p.tables) == dump_rows(engine, p.tables)
    other.dispose()


_PART = re.compile(
    r"The notes under `(?P<ns>[^`]+)/` describe the record `(?P<subject>[^`]+)`\. Collect every field of "
    r"`[^`]+` \((?P<fields>[^)]*)\) and write them as a JSON object to `(?P<answer>answers/[^`]+\.json)`\."
)
_FIRST_LOOK = """mkdir -p answers
python3 - {ns} {subject} {answer} <<'PY'
import json, os, sys
ns, subject, answer = sys.argv[1:]
first = sorted(os.listdir(ns))[0]  # the shortcut: the first notes file is taken to hold the whole record
facts = {{}}
for line in open(os.path.join(ns, first)):
    if line.startswith(subject + "."):
        k, v = line.split(" = ")
        facts[k.split(".", 1)[1]] = v.strip()
json.dump(facts, open(answer, "w"))
PY
"""


def _first_look(task_dir: Path) -> tuple[float, list[str]]:
    """An agent's policy, written from what an agent sees (``instruction.md`` and the workspace, never ``tests/``
    or ``solution/``): list the notes folder, read its first file, answer with the record's fields found there.
    It is right exactly when one file holds the whole record. Run in the sandbox, graded by the task's verifier."""
    parts = list(_PART.finditer((task_dir / "instruction.md").read_text()))
    assert parts, "the instruction asks for no record (the pattern's wording changed?)"
    script = "".join(_FIRST_LOOK.format(**p.groupdict()) for p in parts)
    outcome = run_solution(task_dir, script)
    assert outcome.score is not None, outcome.detail  # an ungraded run proves nothing either way
    ws = task_dir / "environment" / "workspace"
    actions: list[str] = []
    for p in parts:
        first = sorted(f.name for f in (ws / p["ns"]).iterdir())[0]
        actions += [json.dumps({"command": f"ls {p['ns']}"}), json.dumps({"command": f"cat {p['ns']}/{first}"})]
    return outcome.score, actions


async def test_the_solver_that_scored_on_v1_scores_less_on_v2(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    """v1 is hardened by the live loop (its runs flag it, ``harden`` builds v2); the same solver then runs on v2.

    The solver and the grading are deterministic, so a v2 with v1's files scores v1's reward and fails the last
    assertion: only a v2 that is harder for this very solver passes."""
    skill = next(s for s in ingest(EXAMPLES, tmp_path / "sk").accepted if s.name == "log-triage")
    synth = Synthesizer(tmp_path / "store", GateLimits(hang_timeout_s=1.0))
    build = await asyncio.to_thread(synth.synthesize, skill, 5, n_challenges=1, patterns=["distributed-evidence"])
    assert build.ok, [v for v in build.verdicts if not v.ok]
    task_id = build.blueprint.task_id
    await event_log.append_many(build.events)

    hardening = HardeningProjection(window=2)
    runners = [ProjectionRunner(TasksProjection(), event_log, engine), ProjectionRunner(hardening, event_log, engine)]
    stop = asyncio.Event()
    tasks = await _fold(runners, stop)
    try:
        v1: list[float] = []
        for i in range(2):
            score, actions = await asyncio.to_thread(_first_look, build.task_dir)
            v1.append(score)
            await event_log.append_many(_recorded(f"ex{i}", task_id, 1, actions, score))
        assert v1 == [1.0, 1.0]  # at v1 the shortcut is a solution
        await await_until(lambda: synth.pending(engine) == [(task_id, 1)], "v1 is flagged too easy")
        events = await asyncio.to_thread(synth.harden, engine, task_id, 1, hardening)
        hardened = next(e for e in events if isinstance(e, TaskHardened))
        await event_log.append_many(events)
        for r in runners:
            await r.wait_caught_up(60)
    finally:
        stop.set()
        await asyncio.gather(*tasks)

    assert hardened.to_version == 2 and Path(hardened.task_dir) != build.task_dir
    v2, _ = await asyncio.to_thread(_first_look, Path(hardened.task_dir))
    assert v2 < v1[0], (v2, hardened.reason)


def test_a_version_that_adds_a_challenge_says_it_in_a_procedural_goal_and_keeps_a_written_one() -> None:
    written = sparse_and_distributed(6)
    (_, m0), (_, m1) = materials(written)
    trajs = [
        [f"cat {m0.evidence[0]}", f"cat {m1.evidence[0]}"]
    ] * 3  # c1, at its top level, bypassed  # its goal, "g", was written (the LLM mode's): kept as it is
    top, _ = propose(written, diagnose(written, trajs))
    assert len(top.challenges) == 3 and top.goal == "g"
    ids = [c.pattern_id for c in written.challenges]
    procedural = msgspec.structs.replace(written, goal=procedural_goal("s", ids))
    top, _ = propose(procedural, diagnose(procedural, trajs))
    assert top.goal == procedural_goal("s", [c.pattern_id for c in top.challenges])
    assert get_pattern(top.challenges[2].pattern_id).goal in top.goal
