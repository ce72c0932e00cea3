"""One contract for every event log: the same tests run on the NATS log and on the in-memory one.

What ``eventsourcing`` does for its recorders: a parametrised fixture, so a semantic the in-memory log gets
wrong (dedup, optimistic concurrency, ordering, filters, blobs) fails here beside the NATS log's answer.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from opengyre.eventlog import (
    BLOB_MISSING,
    BlobUnreadable,
    ConcurrencyError,
    EventLogProtocol,
    LogConfig,
    MemoryEventLog,
)
from opengyre.events import ExecutionDispatched, ExecutionFinished, InvalidEvent, ModelCallRecorded, TaskSynthesized


@pytest.fixture(params=["nats", "memory"])
def any_log(request: pytest.FixtureRequest, log_config: LogConfig) -> EventLogProtocol:
    if request.param == "nats":
        # Only the NATS case asks for a server (the shared fixture), so the in-memory case runs without one.
        log: EventLogProtocol = request.getfixturevalue("event_log")
        return log
    return MemoryEventLog(log_config)


def _dispatched(i: int) -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g")


def _finished(i: int, score: float = 1.0) -> ExecutionFinished:
    return ExecutionFinished(execution_id=f"e{i}", status="completed", score=score)


async def test_an_empty_log_has_no_events(any_log: EventLogProtocol) -> None:
    assert await any_log.last_seq() == 0
    assert [s async for s in any_log.read()] == []


async def test_one_sequence_over_all_aggregates_in_append_order(any_log: EventLogProtocol) -> None:
    events = [_dispatched(1), _dispatched(2), _finished(1), _finished(2, 0.5)]
    appended = [await any_log.append(e) for e in events]
    assert [a.seq for a in appended] == [1, 2, 3, 4]
    assert await any_log.last_seq() == 4 and await any_log.first_seq() == 1
    stored = [s async for s in any_log.read()]
    assert [s.seq for s in stored] == [1, 2, 3, 4]
    assert [any_log.decode(s) for s in stored] == events
    assert [s.event_id for s in stored] == [e.event_id for e in events]
    # A shared aggregate's subject ends with the event's type (its owners' permissions are per type).
    assert stored[0].subject == any_log.config.subject("execution", "e1", "execution-dispatched")


async def test_a_retried_append_with_the_same_event_id_is_stored_once(any_log: EventLogProtocol) -> None:
    e = _dispatched(1)
    first = await any_log.append(e)
    again = await any_log.append(e)
    assert (first.seq, first.duplicate, again.seq, again.duplicate) == (1, False, 1, True)
    many = await any_log.append_many([e, _dispatched(2), e])
    assert [(a.seq, a.duplicate) for a in many] == [(1, True), (2, False), (1, True)]
    assert await any_log.last_seq() == 2


async def test_a_stale_expected_sequence_raises_and_appends_nothing(any_log: EventLogProtocol) -> None:
    first = await any_log.append(_dispatched(1), expected_last_subject_seq=0)
    with pytest.raises(ConcurrencyError) as exc:
        await any_log.append(_finished(1), expected_last_subject_seq=0)
    # Per aggregate, not per subject: the dispatched event counts against the finished one (another type).
    assert exc.value.subject == any_log.config.subject("execution", "e1", "execution-finished")
    assert exc.value.expected == 0
    assert await any_log.last_seq() == 1
    assert (await any_log.append(_finished(1), expected_last_subject_seq=first.seq)).seq == 2
    # Another aggregate's sequence does not count against this one.
    assert (await any_log.append(_dispatched(2), expected_last_subject_seq=0)).seq == 3


async def test_of_concurrent_appends_with_one_expectation_exactly_one_wins(any_log: EventLogProtocol) -> None:
    base = await any_log.append(_dispatched(7))
    attempts = [any_log.append(_finished(7, s), expected_last_subject_seq=base.seq) for s in (0.1, 0.2, 0.3)]
    results = await asyncio.gather(*attempts, return_exceptions=True)
    assert sum(not isinstance(r, BaseException) for r in results) == 1
    assert all(isinstance(r, ConcurrencyError) for r in results if isinstance(r, BaseException))
    assert await any_log.last_seq() == base.seq + 1


async def test_an_event_no_store_could_keep_appends_nothing_of_its_batch(any_log: EventLogProtocol) -> None:
    bad = ExecutionDispatched(execution_id="e9", task_id="t\x00", group_id="g")
    with pytest.raises(InvalidEvent):
        await any_log.append(bad)
    with pytest.raises(InvalidEvent):
        await any_log.append_many([_dispatched(1), bad])
    assert await any_log.last_seq() == 0


async def test_reads_keep_a_range_and_subject_filters(any_log: EventLogProtocol) -> None:
    task = TaskSynthesized(task_id="t1", skill_id="s")
    await any_log.append_many([_dispatched(1), task, _finished(1), _dispatched(2)])
    cfg = any_log.config
    assert [s.seq async for s in any_log.read(2, 3)] == [2, 3]
    only_tasks = [s.seq async for s in any_log.read(subjects=[cfg.aggregate_filter("task")])]
    assert only_tasks == [2]
    one = [s.seq async for s in any_log.read(subjects=cfg.instance_filters("execution", "e1"))]
    assert one == [1, 3]
    both = [
        s.seq
        async for s in any_log.read(subjects=[*cfg.instance_filters("execution", "e2"), cfg.aggregate_filter("task")])
    ]
    assert both == [2, 4]
    assert [s.seq async for s in any_log.read(5)] == []


async def test_typed_reads_give_only_the_types_asked_for(any_log: EventLogProtocol) -> None:
    fin = _finished(1)
    await any_log.append_many([_dispatched(1), TaskSynthesized(task_id="t1", skill_id="s"), fin])
    finished = [(seq, e) async for seq, e in any_log.events(ExecutionFinished)]
    assert finished == [(3, fin)]
    assert [seq async for seq, _ in any_log.events(start_seq=2)] == [2, 3]
    assert [seq async for seq, _ in any_log.events(ExecutionDispatched, TaskSynthesized, end_seq=2)] == [1, 2]


async def test_get_gives_one_event_by_its_sequence(any_log: EventLogProtocol) -> None:
    fin = _finished(1)
    await any_log.append_many([_dispatched(1), fin])
    got = await any_log.get(2)
    subject = any_log.config.subject("execution", "e1", "execution-finished")
    assert (got.seq, got.type_name, got.subject) == (2, "execution-finished", subject)
    assert any_log.decode(got) == fin


async def test_a_body_too_large_to_keep_inline_reads_back_the_same(any_log: EventLogProtocol) -> None:
    big = ModelCallRecorded(
        execution_id="e1", call_id="c1", prompt_delta_ids=list(range(300_000)), output_ids=[1], output_logprobs=[-0.1]
    )
    await any_log.append(big)
    assert [any_log.decode(s) async for s in any_log.read()] == [big]
    assert any_log.decode(await any_log.get(1)) == big


async def test_blobs_read_back_and_a_missing_one_is_unreadable_for_good(any_log: EventLogProtocol) -> None:
    ref = await any_log.put_blob("weights-1", b"\x00\x01" * 1000)
    assert await any_log.get_blob(ref) == b"\x00\x01" * 1000
    with pytest.raises(BlobUnreadable) as exc:
        await any_log.get_blob("never-put")
    assert exc.value.reason == BLOB_MISSING


async def test_a_subscription_follows_from_its_start_in_order(any_log: EventLogProtocol) -> None:
    first, second = _finished(1), _finished(2)
    await any_log.append_many([_dispatched(1), first])
    got: list[tuple[int, object]] = []
    async with contextlib.aclosing(any_log.subscribe(ExecutionFinished, start_seq=1)) as sub:
        it = aiter(sub)
        got.append(await anext(it))
        await any_log.append_many([_dispatched(2), second])
        got.append(await anext(it))
    assert got == [(2, first), (4, second)]
