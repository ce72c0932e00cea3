"""Tracking positions count in one stream: a re-created stream, or one restored to an earlier state, is
refused loudly (runner, status, CLI) instead of having its events skipped, until the projection is rebuilt."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from opengyre.eventlog import EventLog, LogConfig
from opengyre.projection import ProjectionRunner, StreamMismatch, rebuild, replay_into
from opengyre.runtime import EmbeddedNats
from opengyre.store import Tracking, create_db_engine, migrate

from ..._polling import await_until
from ._counting import CountingProjection, counts, metadata, sample_events


def _total(engine: Engine) -> int:
    with engine.connect() as c:
        return int(c.execute(select(func.coalesce(func.sum(counts.c.n), 0))).scalar() or 0)


async def _fold_all(runner: ProjectionRunner) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def _recreate(log: EventLog) -> None:
    await log.js.delete_stream(log.config.stream)
    await log.ensure_stream()


async def test_a_recreated_stream_is_refused_until_the_projection_is_rebuilt(
    event_log: EventLog, engine: Engine
) -> None:
    """Before: the runner went on at position + 1 of the new stream and skipped its first events silently."""
    metadata.create_all(engine)
    await event_log.append_many(sample_events(20))  # 30 events
    await _fold_all(ProjectionRunner(CountingProjection(), event_log, engine))
    assert _total(engine) == 30

    await _recreate(event_log)
    await event_log.append_many(sample_events(40))  # 60 events: seqs 1..60 of another stream
    runner = ProjectionRunner(CountingProjection(), event_log, engine)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await await_until(lambda: runner.error is not None, "the runner refuses the re-created stream")
        assert "deleted and re-created" in (runner.error or "")
        st = await runner.status()
        assert st.error is not None and "opengyre projections rebuild test-counting" in st.error
        assert not st.caught_up
        with pytest.raises(StreamMismatch):
            await runner.wait_caught_up(5)
        assert not task.done()  # it stays up to say why
    finally:
        stop.set()
        await task
    assert _total(engine) == 30  # nothing of the new stream folded onto the old positions
    with pytest.raises(StreamMismatch):
        await replay_into(CountingProjection(), event_log, engine)

    assert await rebuild(CountingProjection(), event_log, engine) == 60
    assert _total(engine) == 60
    await event_log.append_many(sample_events(2))
    await _fold_all(ProjectionRunner(CountingProjection(), event_log, engine))
    assert _total(engine) == 63


async def test_a_stream_recreated_under_a_running_runner_is_refused(event_log: EventLog, engine: Engine) -> None:
    metadata.create_all(engine)
    await event_log.append_many(sample_events(10))
    runner = ProjectionRunner(CountingProjection(), event_log, engine)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
        await _recreate(event_log)
        await event_log.append_many(sample_events(30))
        await await_until(lambda: runner.error is not None, "the running runner refuses the re-created stream")
        assert _total(engine) == 15
    finally:
        stop.set()
        await task


async def test_a_stream_that_ends_before_the_position_is_refused(tmp_path: Path, log_config: LogConfig) -> None:
    """The JetStream store is put back to an earlier copy (a restore, or a second server on the same store):
    the stream keeps its identity but lost events the projection applied; new ones would be skipped."""
    store = tmp_path / "nats"
    server = EmbeddedNats(store)
    server.start()
    engine = create_db_engine(f"sqlite:///{tmp_path / 'p.db'}")
    migrate(engine)
    metadata.create_all(engine)
    try:
        log = await EventLog.connect(server.url, log_config)
        await log.append_many(sample_events(10))  # 15 events
        await log.close()
        server.stop()
        shutil.copytree(store / "jetstream", tmp_path / "copy")
        server.start()
        log = await EventLog.connect(server.url, log_config)
        await log.append_many(sample_events(10))  # 30 events
        await _fold_all(ProjectionRunner(CountingProjection(), log, engine))
        assert _total(engine) == 30
        await log.close()
        server.stop()
        shutil.rmtree(store / "jetstream")
        shutil.copytree(tmp_path / "copy", store / "jetstream")
        server.start()
        log = await EventLog.connect(server.url, log_config)
        assert await log.last_seq() == 15
        runner = ProjectionRunner(CountingProjection(), log, engine)
        with pytest.raises(StreamMismatch, match=r"applied events up to seq 30, but stream \S+ ends at seq 15"):
            await runner.ensure_consumer()
        # Appended to again before anyone looked: seqs 16..45, of which 31..45 would be folded and 16..30 skipped.
        await log.append_many(sample_events(20))
        with pytest.raises(StreamMismatch, match=r"at seq 30, but stream .+ holds event .+ rolled back and appended"):
            await runner.ensure_consumer()
        st = await runner.status()
        assert st.error is not None and st.position == 30 and st.stream_last_seq == 45
        assert await rebuild(CountingProjection(), log, engine) == 45
        assert _total(engine) == 45
        with engine.connect() as c:
            assert c.execute(select(func.count()).select_from(Tracking)).scalar() == 45
        await log.close()
    finally:
        server.stop()
        engine.dispose()
