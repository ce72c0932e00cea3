"""The trainer's projection: corrupt, truncated and mismatched trajectories and events for unknown executions
are rejected with a recorded reason; rebuilding from the log gives the live rows byte for byte."""

from __future__ import annotations

import msgspec
from sqlalchemy import Engine, select

from opengyre.eventlog import EventLog
from opengyre.events import (
    CellRegistered,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TrainingStepCompleted,
    WeightSpan,
    WeightsPublished,
    new_event_id,
)
from opengyre.projection import ProjectionRunner, dump_rows, rebuild
from opengyre.store import DeadLetter
from opengyre.trainer import TrainerProjection, TrainerStore

from ._events import calls, catch_up, group


def bad_call(eid: str, cid: str, **kw: object) -> ModelCallRecorded:
    base: dict[str, object] = dict(
        execution_id=eid, call_id=cid, prompt_delta_ids=[1, 2], output_ids=[3, 4], output_logprobs=[-0.5, -0.5]
    )
    base.update(kw)
    return ModelCallRecorded(**base)  # type: ignore[arg-type]


async def test_rejections_are_recorded_with_reasons(event_log: EventLog, engine: Engine) -> None:
    good = calls("x", 1)
    events = [
        ExecutionDispatched(execution_id="x", task_id="t", group_id="g"),
        *good[:2],
        bad_call("ghost", "k0"),  # unknown execution
        bad_call("x", "k1", output_logprobs=[-0.5]),  # 2 ids, 1 logprob
        bad_call("x", "k2", parent_call_id="nope", prefix_len=1),  # unknown parent
        bad_call("x", "k3", parent_call_id="c0", prefix_len=17),  # c0 has 16 tokens
        bad_call("x", "k4", prefix_len=3),  # a root with a prefix
        bad_call("x", "k5", output_logprobs=[-0.5, 0.7]),  # not a log probability
        bad_call("x", "k6", output_ids=[3, -4]),
        msgspec.structs.replace(good[0], event_id=new_event_id()),  # the same call again (a new event)
        ExecutionFinished(execution_id="ghost", status="completed", score=1.0),
        ExecutionFinished(execution_id="x", status="evaluator-failed", score=0.3),  # a failure carrying a score
        ExecutionFinished(execution_id="x", status="timed-out", score=0.25),
        ExecutionFinished(execution_id="x", status="completed", score=1.0),  # finished twice
        good[2],  # answered before the finish, in the log after it (the proxy's outbox drained late): applied
        ExecutionDispatched(execution_id="x", task_id="t", group_id="g"),
        TrainingStepCompleted(step=1, weight_version="v1", loss=0.0, n_samples=0, n_tokens=0, execution_ids=["zzz"]),
        TrainingStepCompleted(step=2, weight_version="v1", loss=0.0, n_samples=0, n_tokens=0, execution_ids=["x"]),
        good[3],  # after a step consumed the execution: its samples are fixed
    ]
    await event_log.append_many(events)
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    with engine.connect() as c:
        reasons = [r for (r,) in c.execute(select(DeadLetter.reason).order_by(DeadLetter.stream_seq))]
    assert reasons == [
        "unknown-execution",
        "length-mismatch",
        "unknown-parent",
        "bad-prefix",
        "bad-prefix",
        "corrupt-logprobs",
        "corrupt-tokens",
        "duplicate-call",
        "unknown-execution",
        "score-on-failure",
        "already-finished",
        "duplicate-execution",
        "unknown-execution",
        "call-after-consumed",
    ]
    store = TrainerStore(engine)
    row = store.execution("x")
    assert row is not None
    assert (row["status"], row["score"], row["verdict"], row["n_calls"]) == ("timed-out", 0.25, "ok", 3)
    assert store.corrupt(["x"]) == {"x": "length-mismatch"}
    assert len(store.tree("x")) == 3  # only the calls that fit


async def test_rebuild_equals_live(event_log: EventLog, engine: Engine) -> None:
    events = [
        *group("g1", [("completed", 1.0, None), ("timed-out", 0.5, None), ("evaluator-failed", None, "evaluator")]),
        *group("g2", [("completed", 0.0, None), ("infra-failed", None, "oom")], seed=1),
        TrainingStepCompleted(
            step=1,
            weight_version="default-s1",
            loss=0.1,
            n_samples=3,
            n_tokens=99,
            execution_ids=["g1-e0", "g1-e1"],
            dropped={"g1-e2": "excluded:evaluator-failure"},
            metrics={"grad_norm": 0.5},
        ),
        bad_call("g1-e0", "late"),  # after the step consumed it: dead-lettered
        WeightsPublished(weight_version="default-s1", step=1, uri="/tmp/ckpt", digest="abc"),
        WeightsPublished(weight_version="default-s1", step=1, uri="/tmp/ckpt", digest="abc"),
        CellRegistered(cell_id="c1", role="rollout", engine_url="http://e1"),
        CellRegistered(cell_id="c2", role="rollout", engine_url="http://e2"),
        CellRoleChanged(cell_id="c1", from_role="rollout", to_role="draining"),  # a legal step: no longer serving
        ExecutionDispatched(execution_id="x", task_id="t", group_id="h"),
        bad_call("x", "k", weight_versions=[WeightSpan(version="v1", start=0, end=1)]),
    ]
    await event_log.append_many(events)
    projection = TrainerProjection()
    await catch_up(ProjectionRunner(projection, event_log, engine))
    live = dump_rows(engine, projection.tables)
    assert len(live["trainer_calls"]) == 26 and len(live["trainer_steps"]) == 1 and len(live["trainer_weights"]) == 1
    store = TrainerStore(engine)
    e0 = store.execution("g1-e0")
    assert e0 is not None and (e0["consumed_step"], e0["consumed_as"]) == (1, "train")
    assert store.steps()[0]["reward_mean"] == 0.75
    assert store.version_steps() == {"default-s1": 1}
    assert [g.group_id for g in store.ready_groups()] == ["g2"]  # g1 is consumed
    assert store.rollout_engines() == ["http://e2"] and len(live["trainer_engines"]) == 2
    await rebuild(projection, event_log, engine)
    assert dump_rows(engine, projection.tables) == live


async def test_weight_version_spans_survive_the_store(event_log: EventLog, engine: Engine) -> None:
    spans = [WeightSpan(version="v1", start=0, end=2), WeightSpan(version="v2", start=2, end=4)]
    events = [
        ExecutionDispatched(execution_id="x", task_id="t", group_id="g"),
        bad_call("x", "ok", output_ids=[3, 4, 5, 6], output_logprobs=[-0.5] * 4, weight_versions=spans),
        bad_call("x", "bad", weight_versions=[WeightSpan(version="v1", start=1, end=3)]),  # 2 outputs only
    ]
    await event_log.append_many(events)
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    path = TrainerStore(engine).tree("x").path_sequence("ok")
    assert path.weight_versions == ("", "", "v1", "v1", "v2", "v2")  # two context tokens, then the outputs
    with engine.connect() as c:
        assert [r for (r,) in c.execute(select(DeadLetter.reason))] == ["bad-weight-spans"]
