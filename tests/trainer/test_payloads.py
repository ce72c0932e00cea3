"""Calls recorded by reference: the trainer keeps the reference and the lengths, reads the payloads when it
builds a step, trains on exactly the recorded ids and logprobs, and drops (with the reason) an execution whose
payload is missing or damaged instead of training on a guess."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from sqlalchemy import Engine, select, text

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import Event, ExecutionDispatched, ModelCallRecorded, PayloadRef, new_event_id
from opengyre.projection import ProjectionRunner, dump_rows, rebuild
from opengyre.runtime import EmbeddedNats
from opengyre.store import DeadLetter
from opengyre.trainer import AdmissionPolicy, PathSampler, TrainerProjection, TrainerStore, prepare_step
from opengyre.trajectory import TokenPayload, encode_payload, payload_digest, split_payload

from .._polling import await_until
from ._events import by_reference, calls, catch_up, group


async def test_calls_by_reference_give_the_same_trees_as_inline_ones(event_log: EventLog, any_engine: Engine) -> None:
    engine = any_engine  # SQLite, and PostgreSQL where one answers
    inline = group("ga", [("completed", 1.0, None), ("completed", 0.0, None)])
    await event_log.append_many([*inline, *await by_reference(event_log, group("gb", [("completed", 1.0, None)] * 2))])
    projection = TrainerProjection()
    await catch_up(ProjectionRunner(projection, event_log, engine))
    with engine.connect() as c:
        assert list(c.execute(select(DeadLetter.reason))) == []
        rows = c.execute(text("SELECT execution_id, prompt_delta, payload_digest FROM trainer_calls")).all()
    assert {(r[0][:2], r[1] == b"", r[2] is None) for r in rows} == {("ga", False, True), ("gb", True, False)}
    store = TrainerStore(engine)
    fetched = await store.fetch_payloads(event_log, ["gb-e0", "gb-e1"])
    assert len(fetched.found) == 10 and not fetched.failed
    for i in range(2):
        a, b = store.tree(f"ga-e{i}"), store.tree(f"gb-e{i}", fetched)
        assert [b.path_sequence(leaf) for leaf in b.leaves()] == [a.path_sequence(leaf) for leaf in a.leaves()]
        assert store.execution(f"ga-e{i}")["n_generated"] == store.execution(f"gb-e{i}")["n_generated"]  # type: ignore[index]
    live = dump_rows(engine, projection.tables)
    await rebuild(projection, event_log, engine)
    assert dump_rows(engine, projection.tables) == live


async def test_a_missing_or_damaged_payload_drops_its_execution_with_the_reason(
    event_log: EventLog, engine: Engine
) -> None:
    out: list[Event] = []
    # Five members, so the two intact ones left still carry a learning signal (and the breaker stays off).
    members = [("completed", 1.0, None), ("completed", 0.0, None), ("completed", 0.5, None)]
    for e in group("g", [*members, ("completed", 0.0, None), ("completed", 0.5, None)]):
        if isinstance(e, ModelCallRecorded):
            slim, raw = split_payload(e)
            if (e.execution_id, e.call_id) == ("g-e2", "c4"):  # a payload holding a logprob above 0
                raw = encode_payload(TokenPayload(e.prompt_delta_ids, e.output_ids, [0.7] * len(e.output_ids)))
                ref = PayloadRef(digest=payload_digest(raw), size=len(raw), prompt_delta=6, output=8)
                slim = msgspec.structs.replace(slim, payload=ref)
            if e.execution_id != "g-e1":  # g-e1's payloads never made it to the store
                await event_log.payloads.put(e.execution_id, raw)
            e = slim
        out.append(e)
    await event_log.append_many(out)
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    store = TrainerStore(engine)
    [ready] = store.ready_groups(5)
    ids = [o.execution_id for o in ready.outcomes]
    fetched = await store.fetch_payloads(event_log, ids)
    prepared = prepare_step(
        1,
        [ready],
        policy=AdmissionPolicy(group_size=5),
        sampler=PathSampler(None),
        load_tree=lambda eid: store.tree(eid, fetched),
        corrupt=store.corrupt(ids),
        version_steps={},
    )
    assert sorted(prepared.trained) == ["g-e0", "g-e3", "g-e4"]
    assert prepared.dropped == {"g-e1": "excluded:payload-missing", "g-e2": "excluded:payload-corrupt"}


async def test_a_call_with_tokens_both_inline_and_by_reference_is_rejected(event_log: EventLog, engine: Engine) -> None:
    [call, *_] = [e for e in calls("x", 1) if isinstance(e, ModelCallRecorded)]
    [slim] = await by_reference(event_log, [call])
    assert isinstance(slim, ModelCallRecorded)
    both = msgspec.structs.replace(
        slim, event_id=new_event_id(), output_ids=call.output_ids, output_logprobs=call.output_logprobs
    )
    short = msgspec.structs.replace(
        slim, event_id=new_event_id(), call_id="c9", parent_call_id="c0", prefix_len=slim.n_prompt_delta + 7
    )
    await event_log.append_many([ExecutionDispatched(execution_id="x", task_id="t", group_id="g"), both, slim, short])
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    with engine.connect() as c:
        reasons = [r for (r,) in c.execute(select(DeadLetter.reason).order_by(DeadLetter.stream_seq))]
    # The prefix check uses the lengths the reference carries (c0 has 10 + 6 tokens).
    assert reasons == ["ambiguous-tokens", "bad-prefix"]


@pytest.mark.parametrize(
    "away_s",
    [0.0, pytest.param(25.0, marks=pytest.mark.slow)],
    ids=["restart", "longer-than-a-request"],  # nats-py replays a request sent while away; past its timeout it fails
)
async def test_reading_payloads_waits_out_a_restarted_server(
    tmp_path: Path, log_config: LogConfig, engine: Engine, away_s: float
) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await EventLog.connect(server.url, log_config)
    try:
        await log.append_many(await by_reference(log, group("g", [("completed", 1.0, None)])))
        await catch_up(ProjectionRunner(TrainerProjection(), log, engine))
        store = TrainerStore(engine)
        server.stop()  # the log goes away just as a step reads its payloads
        task = asyncio.create_task(store.fetch_payloads(log, ["g-e0"]))
        await await_until(lambda: not log.nc.is_connected, "the client saw the server go")
        await asyncio.sleep(away_s)  # the length of the outage (the fault), not a synchronisation
        assert not task.done()
        server = EmbeddedNats(tmp_path / "nats", port=server.port)  # the same store, the same address
        server.start()
        fetched = await asyncio.wait_for(task, 120)
        assert len(fetched.found) == 5 and not fetched.failed  # every payload, none reported missing
    finally:
        await log.close()
        server.stop()
