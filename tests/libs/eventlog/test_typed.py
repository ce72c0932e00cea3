"""Typed reads against a real nats-server: the wanted types, decoded, in order; undecodable ones skipped."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from opengyre.eventlog import EventLog
from opengyre.events import CellRegistered, Event, ExecutionDispatched, ExecutionFinished

from ..._polling import await_until


def _dispatched(i: int) -> ExecutionDispatched:
    return ExecutionDispatched(execution_id=f"e{i}", task_id="t", group_id="g")


FINISHED = [ExecutionFinished(execution_id=f"e{i}", status="completed", score=i / 10) for i in range(3)]


def _finished(i: int) -> ExecutionFinished:
    return FINISHED[i]  # the same event (same id) each time: what was read back is compared with it


async def _garbage(log: EventLog) -> None:
    """Two messages no service can decode: a malformed body of a known type, and an unknown type."""
    await log.nc.publish(log.config.subject("execution", "bad"), b"{oops", headers={"Og-Type": "execution-finished"})
    await log.nc.publish(log.config.subject("execution", "new"), b"{}", headers={"Og-Type": "execution-exploded"})
    await log.nc.flush()


async def test_events_yields_the_wanted_types_decoded_and_skips_what_cannot_decode(event_log: EventLog) -> None:
    await event_log.append_many([_dispatched(1), _finished(1)])
    await _garbage(event_log)  # seq 3, 4
    await event_log.append_many([CellRegistered(cell_id="c0", role="rollout"), _dispatched(2), _finished(2)])

    finished = [(seq, e) async for seq, e in event_log.events(ExecutionFinished)]
    assert finished == [(2, _finished(1)), (7, _finished(2))]
    assert all(isinstance(e, ExecutionFinished) for _, e in finished)

    both = [seq async for seq, _ in event_log.events(ExecutionDispatched, CellRegistered)]
    assert both == [1, 5, 6]  # two aggregates' subjects, in log order

    everything = [seq async for seq, _ in event_log.events()]
    assert everything == [1, 2, 5, 6, 7]  # 3 and 4 skipped, nothing after them lost
    assert [seq async for seq, _ in event_log.events(start_seq=2, end_seq=5)] == [2, 5]

    with pytest.raises(TypeError):
        [x async for x in event_log.events(dict)]  # type: ignore[arg-type]


async def _collect(it: object, n: int, out: list[tuple[int, Event]]) -> None:
    async with contextlib.aclosing(it) as events:  # type: ignore[type-var]
        async for item in events:
            out.append(item)
            if len(out) == n:
                return


async def test_subscribe_follows_appends_of_the_wanted_types_from_now_or_from_a_position(
    event_log: EventLog,
) -> None:
    await event_log.append_many([_dispatched(0), _finished(0)])  # history: seq 1, 2
    live: list[tuple[int, Event]] = []
    replay: list[tuple[int, Event]] = []
    live_task = asyncio.create_task(_collect(event_log.subscribe(ExecutionFinished), 2, live))
    replay_task = asyncio.create_task(_collect(event_log.subscribe(ExecutionFinished, start_seq=1), 3, replay))
    await _consumers(event_log, 2)  # both subscriptions are in place before the appends below
    await _garbage(event_log)  # seq 3, 4: skipped, not fatal
    await event_log.append_many([_dispatched(1), _finished(1), _dispatched(2), _finished(2)])  # seq 5..8
    await asyncio.wait_for(asyncio.gather(live_task, replay_task), 30)
    assert live == [(6, _finished(1)), (8, _finished(2))]  # only what was appended after subscribing
    assert replay == [(2, _finished(0)), (6, _finished(1)), (8, _finished(2))]


async def test_a_subscription_whose_consumer_is_lost_resumes_after_the_last_delivered_event(
    event_log: EventLog,
) -> None:
    got: list[tuple[int, Event]] = []
    task = asyncio.create_task(_collect(event_log.subscribe(ExecutionDispatched, start_seq=1), 6, got))
    await event_log.append_many([_dispatched(i) for i in range(3)])
    await await_until(lambda: len(got) == 3, "three events delivered")
    # What a server restart or a long disconnect does to an ephemeral consumer: it is gone.
    names = await _consumers(event_log, 1)
    await event_log.js.delete_consumer(event_log.config.stream, names[0])
    await event_log.append_many([_dispatched(i) for i in range(3, 6)])
    await asyncio.wait_for(task, 30)
    assert [seq for seq, _ in got] == [1, 2, 3, 4, 5, 6]  # nothing skipped, nothing twice
    assert [e.execution_id for _, e in got] == [f"e{i}" for i in range(6)]  # type: ignore[attr-defined]


@pytest.mark.parametrize("away_s", [1.0, 4.5], ids=["short", "longer-than-a-request"])
async def test_a_subscription_waits_out_a_restarted_server_and_misses_nothing(tmp_path, log_config, away_s) -> None:  # type: ignore[no-untyped-def]
    from opengyre.runtime import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    log = await EventLog.connect(server.url, log_config)
    got: list[tuple[int, Event]] = []
    task = asyncio.create_task(_collect(log.subscribe(ExecutionDispatched, start_seq=1), 6, got))
    try:
        await log.append_many([_dispatched(i) for i in range(3)])
        await await_until(lambda: len(got) == 3, "three events delivered")
        server.stop()
        await asyncio.sleep(away_s)  # the longer outage outlasts consumer-creation requests: they are retried
        server = EmbeddedNats(tmp_path / "nats", port=server.port)  # the same store, the same address
        server.start()
        await await_until(lambda: log.nc.is_connected, "the client reconnected")
        await log.append_many([_dispatched(i) for i in range(3, 6)])
        await asyncio.wait_for(task, 60)
        assert [seq for seq, _ in got] == [1, 2, 3, 4, 5, 6]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await log.close()
        server.stop()


async def _consumers(log: EventLog, n: int) -> list[str]:
    """The stream's consumers, once there are ``n`` of them."""
    while True:
        names = [c.name for c in await log.js.consumers_info(log.config.stream)]
        if len(names) >= n:
            assert len(names) == n, names
            return names
        await asyncio.sleep(0.05)
