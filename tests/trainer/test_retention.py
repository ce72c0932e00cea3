"""Retention: only what a step consumed and the run has moved past the replay horizon loses its payloads;
projections (the trainer's and the proxy's) keep every count and length, mark the calls compacted, and a
rebuild from the log gives the same rows; a compactor that died between purge and announcement finishes the
job on its next round."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from opengyre.config import Settings
from opengyre.eventlog import EventLog
from opengyre.events import Event, PayloadsCompacted, TrainingStepCompleted
from opengyre.projection import ProjectionRunner, dump_rows, rebuild
from opengyre.proxy import TrajectoryProjection, list_executions, load_calls, load_execution
from opengyre.runtime import ServiceContext
from opengyre.trainer import RetentionPolicy, TrainerProjection, TrainerStore, compact, compactable
from opengyre.trainer.service import TrainerService
from opengyre.trajectory import PayloadUnavailable

from .._polling import await_until
from ._events import by_reference, catch_up, group


def _step(step: int, trained: list[str], dropped: dict[str, str] | None = None) -> TrainingStepCompleted:
    return TrainingStepCompleted(
        step=step,
        weight_version=f"v{step}",
        loss=0.0,
        n_samples=1,
        n_tokens=1,
        execution_ids=trained,
        dropped=dropped or {},
    )


async def _fold(log: EventLog, engine: Engine) -> None:
    for p in (TrainerProjection(), TrajectoryProjection()):
        await catch_up(ProjectionRunner(p, log, engine))


async def test_payloads_go_only_past_the_horizon_and_replay_keeps_the_statistics(
    event_log: EventLog, any_engine: Engine
) -> None:
    engine = any_engine  # SQLite, and PostgreSQL where one answers
    events: list[Event] = []
    for gid in ("g1", "g2", "g3"):
        events += await by_reference(event_log, group(gid, [("completed", 1.0, None), ("completed", 0.0, None)]))
    events += [_step(1, ["g1-e0", "g1-e1"]), _step(2, ["g2-e0"], {"g2-e1": "filtered:stale:3"})]
    await event_log.append_many(events)
    await _fold(event_log, engine)
    store = TrainerStore(engine)
    before = {e: store.execution(e) for e in ("g1-e0", "g2-e1", "g3-e0")}
    n_stored = (await event_log.payloads.usage())[0]
    assert n_stored == 30

    assert compactable(store, RetentionPolicy(retain_steps=None)) == []
    assert compactable(store, RetentionPolicy(retain_steps=2)) == []  # step 1 is within 2 steps of step 2
    done = await compact(store, event_log, RetentionPolicy(retain_steps=1))
    assert [(e.execution_id, e.step, e.calls) for e in done] == [("g1-e0", 1, 5), ("g1-e1", 1, 5)]
    assert all(e.bytes > 0 for e in done)
    assert (await event_log.payloads.usage())[0] == n_stored - 10
    await _fold(event_log, engine)

    # The trainer: statistics stay, the calls say compacted, a reader gets that reason and no invented tokens.
    row = store.execution("g1-e0")
    assert row is not None and row["compacted_seq"] is not None
    assert {k: v for k, v in row.items() if k != "compacted_seq"} == {
        k: v
        for k, v in before["g1-e0"].items()
        if k != "compacted_seq"  # type: ignore[union-attr]
    }
    assert store.payload_keys(["g1-e0"]) == [] and len(store.payload_keys(["g2-e0", "g3-e0"])) == 10
    with pytest.raises(PayloadUnavailable) as exc:
        store.tree("g1-e0", await store.fetch_payloads(event_log, ["g1-e0"]))
    assert exc.value.reason == "payload-compacted"
    assert len(store.tree("g3-e0", await store.fetch_payloads(event_log, ["g3-e0"]))) == 5
    # The proxy's store: the same.
    with engine.connect() as c:
        summaries = {s.execution_id: s for s in list_executions(c)}
        stored = load_calls(c, "g1-e0")
    assert summaries["g1-e0"].compacted_seq is not None and summaries["g2-e0"].compacted_seq is None
    assert summaries["g1-e0"].calls == 5 and summaries["g1-e0"].stored_tokens == summaries["g2-e0"].stored_tokens
    assert all(c.compacted and c.event.n_output > 0 for c in stored)
    with pytest.raises(PayloadUnavailable, match="compacted"):
        await load_execution(engine, event_log, "g1-e0")
    assert len(await load_execution(engine, event_log, "g2-e0")) == 5

    # Replay past the compaction: the same rows, compacted marks included; nothing fails, nothing invented.
    for p in (TrainerProjection(), TrajectoryProjection()):
        live = dump_rows(engine, p.tables)
        await rebuild(p, event_log, engine)
        assert dump_rows(engine, p.tables) == live

    # Horizon 0: the executions of step 2 (trained and dropped) may go; g3, which no step consumed, never.
    assert [c.execution_id for c in compactable(store, RetentionPolicy(retain_steps=0))] == ["g2-e0", "g2-e1"]


async def test_a_compactor_that_died_after_the_purge_finishes_on_its_next_round(
    event_log: EventLog, engine: Engine
) -> None:
    events = await by_reference(event_log, group("g", [("completed", 1.0, None), ("completed", 0.0, None)]))
    await event_log.append_many([*events, _step(1, ["g-e0", "g-e1"])])
    await _fold(event_log, engine)
    store = TrainerStore(engine)
    policy = RetentionPolicy(retain_steps=0)
    # The state a compactor leaves when it dies between the purge and the append: payloads gone, no event.
    await event_log.payloads.purge("g-e0")
    with pytest.raises(PayloadUnavailable) as exc:
        store.tree("g-e0", await store.fetch_payloads(event_log, ["g-e0"]))
    assert exc.value.reason == "payload-missing"
    first = await compact(store, event_log, policy)
    again = await compact(store, event_log, policy)  # before the projection folded the first round
    assert [e.execution_id for e in first] == ["g-e0", "g-e1"] == [e.execution_id for e in again]
    compacted = [e async for _, e in event_log.events(PayloadsCompacted)]
    assert len(compacted) == 2  # the repeated round was stored once (deterministic event ids)
    await _fold(event_log, engine)
    assert compactable(store, policy) == [] and (await event_log.payloads.usage())[0] == 0
    assert all(store.execution(e)["compacted_seq"] for e in ("g-e0", "g-e1"))  # type: ignore[index]


async def test_the_trainer_service_compacts_by_itself(event_log: EventLog, engine: Engine, tmp_path: Path) -> None:
    events = await by_reference(event_log, group("g", [("completed", 1.0, None), ("completed", 0.0, None)]))
    await event_log.append_many([*events, _step(1, ["g-e0", "g-e1"])])
    await _fold(event_log, engine)
    service = TrainerService(RetentionPolicy(retain_steps=0, interval_s=0.05))
    await service.start(ServiceContext(settings=Settings(data_dir=tmp_path), log=event_log, engine=engine))
    try:

        async def announced() -> bool:
            return len([e async for _, e in event_log.events(PayloadsCompacted)]) == 2

        await await_until(announced, "the service compacted the consumed executions")
    finally:
        await service.stop()
    assert (await event_log.payloads.usage())[0] == 0
