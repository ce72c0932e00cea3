"""An execution whose finish carries the proxy's count of recorded calls (the runtime sealed it first) is sampled
only once the trainer has applied that many calls: a call still held in the proxy's outbox keeps it out of every
step (and the status says why) instead of a step training a partial tree; a call past the count is refused. A
finish without the count keeps the old rule (late calls accepted until a step consumed the execution)."""

from __future__ import annotations

from pathlib import Path

import msgspec
from sqlalchemy import Engine, select

from opengyre.config import Settings
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished, TrainingStepCompleted, default_registry
from opengyre.projection import ProjectionRunner
from opengyre.runtime import EmbeddedNats
from opengyre.store import DeadLetter
from opengyre.trainer import OnlineTrainer, TrainerProjection, TrainerStore
from opengyre.v1 import common_pb2, trainer_pb2

from .._polling import await_until
from ._events import calls, folding
from ._serving import serving_trainer
from .test_loop import config


def _dispatch(gid: str, n: int) -> list[ExecutionDispatched]:
    return [
        ExecutionDispatched(execution_id=f"{gid}-e{i}", task_id=f"task-{gid}", group_id=gid, group_size=n)
        for i in range(n)
    ]


async def test_a_step_never_trains_an_execution_before_the_calls_its_finish_counted(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    e0, e1 = calls("s-e0", 1), calls("s-e1", 2)
    held = e0[-1]  # the sub-agent's call: still in the proxy's outbox when the execution is scored
    await event_log.append_many(
        [
            *_dispatch("s", 2),
            *e0[:-1],
            *e1,
            ExecutionFinished(execution_id="s-e0", status="completed", score=1.0, recorded_calls=len(e0)),
            ExecutionFinished(execution_id="s-e1", status="completed", score=0.0, recorded_calls=len(e1)),
        ]
    )
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        store = TrainerStore(engine)
        trainer = OnlineTrainer(config(tmp_path, group_size=2), store, event_log)
        assert await trainer.step_once() is None  # nothing is ready: s-e0 waits for its fifth call
        [waiting] = store.awaiting_calls()
        assert (waiting.execution_id, waiting.applied, waiting.recorded) == ("s-e0", 4, 5)

        await event_log.append(held)  # the outbox drains
        await runner.wait_caught_up(60)
        assert store.awaiting_calls() == []
        report = await trainer.step_once()
        assert report is not None and report.result is not None
        assert sorted(report.completed.execution_ids) == ["s-e0", "s-e1"]
        assert held.call_id in {s.leaf for s in report.prepared.samples if s.execution_id == "s-e0"}


async def test_a_call_past_the_count_is_refused_and_a_finish_without_one_keeps_the_old_rule(
    event_log: EventLog, engine: Engine
) -> None:
    e0, e1 = calls("c-e0", 3), calls("c-e1", 4)
    extra = msgspec.structs.replace(e0[-1], call_id="c9", event_id="late-extra")
    await event_log.append_many(
        [
            *_dispatch("c", 2),
            *e0,
            ExecutionFinished(execution_id="c-e0", status="completed", score=1.0, recorded_calls=len(e0)),
            extra,  # the proxy counted five: a sixth is not the execution's
            *e1[:-1],
            ExecutionFinished(execution_id="c-e1", status="completed", score=0.0),  # no count: old rule
        ]
    )
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        store = TrainerStore(engine)
        assert store.corrupt(["c-e0", "c-e1"]) == {"c-e0": "call-after-seal"}
        assert store.awaiting_calls() == []  # nothing counted for c-e1: it is not held
        await event_log.append(e1[-1])  # late, after the finish: applied as before
        await runner.wait_caught_up(60)
        row = store.execution("c-e1")
        assert row is not None and (row["n_calls"], row["recorded_calls"]) == (5, None)


async def test_a_sealed_execution_takes_its_counted_calls_after_a_step_consumed_it_and_only_the_unsealed_refuse(
    event_log: EventLog, engine: Engine
) -> None:
    """The old rule (a call is applied until a step consumed its execution) is only for finishes without a count: a
    sealed execution's calls are the proxy's count, whatever a step did meanwhile (a step that dropped the execution
    while a call was still in the outbox: answered == applied), and one past the count is refused as past the seal."""
    sealed, unsealed = calls("k-e0", 6), calls("k-e1", 7)
    past = msgspec.structs.replace(sealed[-1], call_id="c9", event_id="past-the-seal")
    await event_log.append_many(
        [
            *_dispatch("k", 2),
            *sealed[:-1],
            *unsealed[:-1],
            ExecutionFinished(execution_id="k-e0", status="completed", score=1.0, recorded_calls=len(sealed)),
            ExecutionFinished(execution_id="k-e1", status="completed", score=0.0),
            TrainingStepCompleted(
                step=1,
                weight_version="v1",
                loss=0.0,
                n_samples=0,
                n_tokens=0,
                dropped={"k-e0": "excluded:test", "k-e1": "excluded:test"},
            ),
            sealed[-1],  # counted by the seal: the execution's, although a step consumed it
            unsealed[-1],  # no count: after the step, refused as before
            past,
        ]
    )
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)):
        with engine.connect() as c:
            dead = [
                (s.split(".")[-2], r)  # <prefix>.execution.<id>.<type>
                for s, r in c.execute(select(DeadLetter.subject, DeadLetter.reason).order_by(DeadLetter.stream_seq))
            ]
        assert dead == [("k-e1", "call-after-consumed"), ("k-e0", "call-after-seal")]
        row = TrainerStore(engine).execution("k-e0")
        assert row is not None and (row["n_calls"], row["recorded_calls"], row["consumed_step"]) == (5, 5, 1)


def test_a_finish_written_before_the_count_existed_still_decodes() -> None:
    reg = default_registry()
    old = msgspec.json.encode(
        {"type": "execution-finished", "execution_id": "x", "status": "completed", "score": 0.5, "detail": ""}
    )
    e = reg.decode("execution-finished", ExecutionFinished.version, old)
    assert isinstance(e, ExecutionFinished) and (e.score, e.recorded_calls) == (0.5, None)
    again = reg.decode("execution-finished", ExecutionFinished.version, reg.encode(e))
    assert again == e


async def test_scored_with_a_count_the_status_says_what_the_trainer_waits_for(
    nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    e0 = calls("w-e0", 5)
    await event_log.append_many([*_dispatch("w", 1), *e0[:2]])
    task_dir = tmp_path / "task"
    (task_dir / "tests").mkdir(parents=True)
    (task_dir / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (tmp_path / "ws").mkdir()
    async with serving_trainer(settings) as stub:
        req = trainer_pb2.ScoreExecutionRequest(
            execution_id="w-e0",
            task_dir=str(task_dir),
            workspace=str(tmp_path / "ws"),
            has_recorded_calls=True,
            recorded_calls=len(e0),
        )
        reply = await stub.ScoreExecution(req)
        assert reply.status == "completed"

        async def scored() -> bool:
            ex = await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="w-e0"))
            return ex.status == "completed"

        await await_until(scored, "the finish was applied", polls=300, every=0.1)
        ex = await stub.GetExecution(trainer_pb2.GetExecutionRequest(execution_id="w-e0"))
        assert (ex.has_recorded_calls, ex.recorded_calls, ex.n_calls) == (True, 5, 2)
        st = await stub.GetStatus(common_pb2.StatusRequest())
        [note] = st.notes
        assert "held out of training" in note and "w-e0 (2 of 5)" in note
        assert not (await stub.ListReadyGroups(trainer_pb2.ListReadyGroupsRequest(default_group_size=1))).groups
        reg = default_registry()
        [fin] = [s.decode(reg) async for s in event_log.read() if s.type_name == "execution-finished"]
        assert isinstance(fin, ExecutionFinished)
        assert fin.recorded_calls == 5

        await event_log.append_many(e0[2:])

        async def released() -> bool:
            return not (await stub.GetStatus(common_pb2.StatusRequest())).notes

        await await_until(released, "the held calls arrived", polls=300, every=0.1)
        groups = await stub.ListReadyGroups(trainer_pb2.ListReadyGroupsRequest(default_group_size=1))
        assert [g.group_id for g in groups.groups] == ["w"]
