"""The hardening loop: a solver that takes shortcuts makes a task too easy; the diagnosis finds the bypassed pattern
instance, the next version raises its knob and passes the gates; lineage is queryable; rebuild equals live."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded, TaskHardened, ToolCallPayload
from opengyre.projection import ProjectionRunner, dump_rows, replay_into
from opengyre.store import create_db_engine, migrate
from opengyre.synth import (
    Blueprint,
    Challenge,
    GateLimits,
    HardeningProjection,
    ShortcutSolver,
    Synthesizer,
    TasksProjection,
    diagnose,
    fill_contract,
    ingest,
    materials,
    propose,
    task_lineage,
)
from tests._polling import await_until

EXAMPLES = Path(__file__).parents[2] / "svc-synth" / "skills"


def _bp(sources: int) -> Blueprint:
    return fill_contract(
        Blueprint(
            task_id="t",
            version=1,
            skill_id="s",
            skill_name="s",
            goal="g",
            seed=1,
            capabilities={},
            challenges=[
                Challenge(cid="c0", pattern_id="sparse-signal", knobs={"distractors": 4}),
                Challenge(cid="c1", pattern_id="distributed-evidence", knobs={"sources": sources}),
            ],
        )
    )


def test_the_diagnosis_finds_the_bypassed_instance_and_the_proposal_raises_it() -> None:
    bp = _bp(4)
    (_, m0), (_, m1) = materials(bp)
    # Every trajectory read the log, but only one of the four sources.
    trajs = [[f"cat {m0.evidence[0]}", f"cat {m1.evidence[0]}"]] * 3
    d = diagnose(bp, trajs)
    assert (d.cid, d.pattern_id, d.coverage) == ("c1", "distributed-evidence", 0.25)
    nxt, why = propose(bp, d)
    assert nxt.version == 2 and nxt.parent_version == 1 and nxt.challenges[1].knobs == {"sources": 6}
    assert "sources 4 -> 6" in why
    top, why = propose(_bp(6), diagnose(_bp(6), trajs))  # at its top level: a compatible pattern joins
    assert len(top.challenges) == 3 and why.startswith("add c2")


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
        for i in range(2):  # the scheduler's and the proxy's events, as they would record this solver's runs
            run = await asyncio.to_thread(solver.solve, build.task_dir, f"run{i}")
            assert run.outcome.score == 1.0  # level 0: the shortcut works
            ex = f"ex{i}"
            await event_log.append_many(
                [
                    ExecutionDispatched(execution_id=ex, task_id=build.blueprint.task_id, group_id="g", task_version=1),
                    *[
                        ModelCallRecorded(
                            execution_id=ex,
                            call_id=f"{ex}-{k}",
                            tool_calls=[ToolCallPayload(id=f"t{k}", name="bash", arguments=a)],
                        )
                        for k, a in enumerate(run.actions)
                    ],
                    ExecutionFinished(execution_id=ex, status="completed", score=run.outcome.score),
                ]
            )
        await await_until(lambda: synth.pending(engine), "the version is flagged too easy")
        ((task_id, version),) = synth.pending(engine)
        events = await asyncio.to_thread(synth.harden, engine, task_id, version, hardening)
        assert [e.type_name() for e in events] == ["task-too-easy", "task-hardened", "task-validated"]
        hardened = events[1]
        assert isinstance(hardened, TaskHardened) and hardened.to_version == 2
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
