"""The runner publishes its committed position: writers await their append being folded instead of polling."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.projection import FoldTransaction, ProjectionRunner, RunnerStopped

from ._counting import CountingProjection, metadata, sample_events


async def test_applied_returns_once_the_append_is_committed(event_log: EventLog, any_engine: Engine) -> None:
    metadata.create_all(any_engine)
    runner = ProjectionRunner(CountingProjection(), event_log, any_engine)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        acks = await event_log.append_many(sample_events(5))
        last = acks[-1].seq
        await runner.applied(last)
        # The tracking rows, not the runner's word, say it is committed.
        assert FoldTransaction(runner.projection, any_engine, event_log.registry).position() >= last
        assert runner.position >= last
        positions = runner.positions()
        assert await anext(positions) >= last
        more = await event_log.append_many(sample_events(1))
        while (pos := await anext(positions)) < more[-1].seq:
            pass
        assert pos >= more[-1].seq
        await positions.aclose()
    finally:
        stop.set()
        await task


async def test_applied_raises_on_a_runner_that_is_not_running(event_log: EventLog, any_engine: Engine) -> None:
    metadata.create_all(any_engine)
    runner = ProjectionRunner(CountingProjection(), event_log, any_engine)
    with pytest.raises(RunnerStopped, match="not running"):
        await runner.applied(1)


async def test_a_runner_stopping_wakes_its_waiters(event_log: EventLog, any_engine: Engine) -> None:
    metadata.create_all(any_engine)
    runner = ProjectionRunner(CountingProjection(), event_log, any_engine)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    ack = await event_log.append_many(sample_events(1))
    await runner.applied(ack[-1].seq)
    # A position nobody will append: only the runner's end can release the waiter.
    waiter = asyncio.create_task(runner.applied(ack[-1].seq + 1000))
    positions = await _until_end(runner, stop)
    with pytest.raises(RunnerStopped, match="stopped"):
        await waiter
    await task
    assert positions and positions[-1] == runner.position  # the stream of positions ends with the runner


async def _until_end(runner: ProjectionRunner, stop: asyncio.Event) -> list[int]:
    seen: list[int] = []
    async for p in runner.positions():
        seen.append(p)
        stop.set()  # the first position is the current one; stopping then must end the iteration
    return seen


class _HeldPublish(ProjectionRunner):
    """A runner whose publish after an ack waits for ``release``, and that says when a caught-up look found
    nothing pending: the window between the ack and the publish, held open."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.looked_empty = asyncio.Event()
        self.hold_at = 0  # publishes of this position or beyond wait (earlier batches pass)

    async def _publish(self, position: int) -> None:
        if position >= self.hold_at:
            await self.release.wait()
        await super()._publish(position)

    async def _progress(self):  # type: ignore[no-untyped-def]
        got = await super()._progress()
        if got[3] == 0:
            self.looked_empty.set()
        return got


async def test_caught_up_means_the_position_is_published_too(event_log: EventLog, any_engine: Engine) -> None:
    """``wait_caught_up`` returns once the consumer has nothing pending; the runner publishes its position
    just after the ack, so a reader keyed on the position (the scheduler's state cache) could find the one
    before and serve a state older than what was folded. It must return only once the position is out."""
    metadata.create_all(any_engine)
    runner = _HeldPublish(CountingProjection(), event_log, any_engine)
    acks = await event_log.append_many(sample_events(3))
    runner.hold_at = acks[-1].seq
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        waiter = asyncio.create_task(runner.wait_caught_up())
        await runner.looked_empty.wait()
        # The look that found nothing pending has returned into ``wait_caught_up``: on the old code the waiter
        # finished in that same step, with the position not yet published.
        assert not waiter.done() or runner.position >= acks[-1].seq, "caught up before the position was published"
        runner.release.set()
        await waiter
        assert runner.position >= acks[-1].seq
    finally:
        runner.release.set()
        stop.set()
        await task
