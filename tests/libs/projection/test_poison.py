"""Poison messages a producer's bug or a damaged store can leave in the log: each is a dead letter with its
reason, on every store alike, and the events behind it apply; a log that is only away is waited out."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest
from sqlalchemy import Engine, func, select

from opengyre.eventlog import BLOB_HEADER, EventLog, LogConfig
from opengyre.events import (
    Event,
    ExecutionDispatched,
    InvalidEvent,
    ModelCallRecorded,
    SkillIngested,
    ToolCallPayload,
)
from opengyre.projection import ProjectionRunner
from opengyre.runtime import EmbeddedNats, all_projections, load_service
from opengyre.store import DeadLetter, Tracking, create_db_engine, migrate

from ..._burst import scripted_burst
from ..._polling import await_until
from ._counting import CountingProjection, counts, metadata


async def _run_until_caught_up(runner: ProjectionRunner) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def _publish_raw(log: EventLog, event: Event, body: bytes, **headers: str) -> None:
    """A message as a producer that skips our checks would write it."""
    subject = log.config.subject(event.aggregate, event.aggregate_id())
    hdrs = {"Og-Type": event.type_name(), "Nats-Msg-Id": event.event_id, **headers}
    ack = await log.js.publish(subject, body, headers=hdrs)
    assert ack.seq > 0


def _dead(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as c:
        return [(int(r[0]), str(r[1])) for r in c.execute(select(DeadLetter.stream_seq, DeadLetter.reason))]


def _skill(i: int, description: str = "d") -> SkillIngested:
    return SkillIngested(skill_id=f"s{i}", name=f"skill-{i}", description=description)


async def test_a_nul_character_is_a_dead_letter_on_every_store_and_is_refused_at_append(
    event_log: EventLog, any_engine: Engine
) -> None:
    """Before: SQLite applied the NUL and PostgreSQL dead-lettered it, so a replay differed between them."""
    tasks = load_service("synth").projections()[0]
    bad = _skill(1, "before\x00after")
    with pytest.raises(InvalidEvent, match=r"\.description holds a NUL"):
        await event_log.append(bad)
    with pytest.raises(InvalidEvent):
        await event_log.append_many([_skill(0), bad])
    assert await event_log.last_seq() == 0  # the producer's error appended nothing of that call
    await event_log.append(_skill(0))
    await _publish_raw(event_log, bad, msgspec.json.encode(bad))
    await event_log.append_many([_skill(i) for i in range(2, 6)])
    runner = ProjectionRunner(tasks, event_log, any_engine)
    await _run_until_caught_up(runner)
    assert _dead(any_engine) == [(2, "nul-character")]
    skills = tasks.tables[1]
    with any_engine.connect() as c:
        names = sorted(c.execute(select(skills.c.skill_id)).scalars())
        tracked = c.execute(select(func.count()).select_from(Tracking)).scalar()
    assert names == ["s0", "s2", "s3", "s4", "s5"]  # acknowledged 6, applied 5, dead 1
    assert tracked == 6


def _big(i: int) -> ModelCallRecorded:
    # ~600 kB of JSON: over the 512 kB inline limit, so its body goes to the object store.
    return ModelCallRecorded(
        execution_id="a", call_id=f"c{i}", prompt_delta_ids=list(range(100_000)), output_ids=[1], output_logprobs=[-0.1]
    )


async def _corrupt(log: EventLog, seq: int) -> None:
    """Remove the chunks of the blob behind ``seq``, keeping its metadata: a damaged object store."""
    raw = await log.js.get_msg(log.config.stream, seq)
    assert raw.headers is not None
    ref = raw.headers[BLOB_HEADER]
    store = await log.js.object_store(log.config.blob_bucket)
    info = await store.get_info(ref)
    await log.js.purge_stream(f"OBJ_{log.config.blob_bucket}", subject=f"$O.{log.config.blob_bucket}.C.{info.nuid}")


async def test_a_missing_or_corrupt_blob_is_a_dead_letter_and_the_events_behind_it_apply(
    event_log: EventLog, engine: Engine
) -> None:
    """Before: ObjectNotFoundError ended the runner (and the service) on the missing one; the corrupt one hung."""
    metadata.create_all(engine)
    dispatched = ExecutionDispatched(execution_id="a", task_id="t", group_id="g")
    await event_log.append(dispatched)  # 1
    ghost = ExecutionDispatched(execution_id="a", task_id="t", group_id="g")
    await _publish_raw(event_log, ghost, b"", **{BLOB_HEADER: f"event-{uuid.uuid4().hex}"})  # 2: no such blob
    await event_log.append(_big(3))  # 3: its chunks go below
    await event_log.append(_big(4))  # 4: a good one out of band
    await event_log.append_many(
        [ExecutionDispatched(execution_id="a", task_id="t", group_id=f"g{i}") for i in range(5)]
    )
    await _corrupt(event_log, 3)
    runner = ProjectionRunner(CountingProjection(), event_log, engine)
    await _run_until_caught_up(runner)
    assert _dead(engine) == [(2, "blob-missing"), (3, "blob-corrupt")]
    with engine.connect() as c:
        n = c.execute(select(counts.c.n).where(counts.c.aggregate_id == "a")).scalar()
        tracked = c.execute(select(func.count()).select_from(Tracking)).scalar()
    assert (n, tracked) == (7, 9)  # acknowledged 9 = applied 7 + dead 2

    # Typed reads skip them with a warning; a live subscription goes on past them.
    seqs = [seq async for seq, _ in event_log.events()]
    assert seqs == [1, 4, 5, 6, 7, 8, 9]
    live: list[int] = []
    async for seq, _ in event_log.subscribe(start_seq=1):
        live.append(seq)
        if seq == 9:
            break
    assert live == seqs
    stored = await event_log.get(2)
    assert (stored.unreadable, stored.body) == ("blob-missing", b"")


async def test_a_blob_read_while_the_log_is_away_is_retried_never_dead_lettered(
    tmp_path, log_config: LogConfig
) -> None:  # type: ignore[no-untyped-def]
    """The message is in hand, then the server goes: a transient error, not a missing blob."""
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    engine = create_db_engine(f"sqlite:///{tmp_path / 'p.db'}")
    migrate(engine)
    metadata.create_all(engine)
    log = await EventLog.connect(server.url, log_config)
    stop = asyncio.Event()
    try:
        await log.append(_big(1))
        runner = ProjectionRunner(CountingProjection(), log, engine, retry_delay=0.2)
        await runner.ensure_consumer()
        puller = log.puller(runner.consumer)
        await puller.start()
        msgs = await puller.next_batch(timeout=5)
        await puller.stop()
        assert len(msgs) == 1
        server.stop()
        handling = asyncio.create_task(runner.handle(msgs, stop))
        await await_until(lambda: runner.retries >= 1 or handling.done(), "a retry while the server is away")
        assert not handling.done(), handling.exception()
        server = EmbeddedNats(tmp_path / "nats", port=server.port)
        server.start()
        outcome = await asyncio.wait_for(handling, 120)
        assert outcome is not None and (outcome.applied, outcome.dead) == (1, {})
        assert _dead(engine) == []
    finally:
        stop.set()
        await log.close()
        server.stop()
        engine.dispose()


async def test_model_output_holding_nul_is_recorded_and_folded_alike_on_every_store(
    event_log: EventLog, any_engine: Engine
) -> None:
    """A model may emit byte 0. Its output (the context's response, tool-call arguments) is not a text field
    the schema checks: it is appended, and every projection stores it serialized, so no store refuses it."""
    burst = scripted_burst(2, "nul")
    i = next(i for i, e in enumerate(burst) if isinstance(e, ModelCallRecorded))
    call = burst[i]
    assert isinstance(call, ModelCallRecorded)
    burst[i] = msgspec.structs.replace(
        call,
        tool_calls=[ToolCallPayload(id="t1", name="run", arguments='{"x": "\x00"}')],
        context={"base": 0, "messages": [{"role": "user", "content": "hi"}], "response": {"content": "a\x00b"}},
    )
    await event_log.append_many(burst)
    for p in all_projections().values():
        await _run_until_caught_up(ProjectionRunner(p, event_log, any_engine))
    dead = _dead(any_engine)  # the burst has poison of its own (calls before their dispatch), none of this kind
    assert not [d for d in dead if d[1] in ("nul-character", "apply-failed")], dead
    calls = all_projections()["trajectories"].tables
    table = next(t for t in calls if "context" in t.c)
    with any_engine.connect() as c:
        stored = c.execute(select(table.c.context, table.c.tool_calls).where(table.c.call_id == call.call_id)).one()
    assert "a\\u0000b" in stored[0] and "\\u0000" in stored[1]
