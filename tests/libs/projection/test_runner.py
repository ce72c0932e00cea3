"""Projections over a real log: rebuild equals live, poison messages are recorded and skipped, redelivery
and transient failures apply nothing twice."""

from __future__ import annotations

import asyncio
import os
import signal
import threading

from sqlalchemy import Connection, Engine, func, select

from opengyre.eventlog import EventLog
from opengyre.events import Event, ExecutionDispatched, ExecutionFinished
from opengyre.projection import FoldTransaction, ProjectionRunner, dump_rows, rebuild, replay_into
from opengyre.runtime import all_projections
from opengyre.store import DeadLetter, Tracking, create_db_engine, migrate

from ..._burst import scripted_burst
from ..._polling import await_until
from ._counting import CountingProjection, counts, metadata, sample_events


async def _run_until_caught_up(runner: ProjectionRunner) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def test_rebuilding_any_projection_gives_exactly_the_live_rows(event_log: EventLog, any_engine: Engine) -> None:
    """Every projection the services register, over the demo's burst (every event type) plus more."""
    metadata.create_all(any_engine)
    projections = [CountingProjection(), *all_projections().values()]
    events = [*scripted_burst(3, "r1"), *sample_events(100), *scripted_burst(4, "r2")]
    await event_log.append_many(events)
    for p in projections:
        await _run_until_caught_up(ProjectionRunner(p, event_log, any_engine))
    live = {p.name: dump_rows(any_engine, p.tables) for p in projections}
    assert sum(r[1] for r in live["test-counting"]["test_counts"]) == len(events)
    for p in projections:
        assert any(live[p.name].values()), f"{p.name} folded nothing: the test would prove nothing"
        await rebuild(p, event_log, any_engine)
        assert dump_rows(any_engine, p.tables) == live[p.name], p.name
    # Live again after the rebuild: new events continue from where the replay stopped.
    await event_log.append_many(sample_events(10))
    await _run_until_caught_up(ProjectionRunner(projections[0], event_log, any_engine))
    with any_engine.connect() as c:
        assert c.execute(select(func.sum(counts.c.n))).scalar() == len(events) + 15


async def test_poison_messages_are_recorded_with_reasons_and_block_nothing(event_log: EventLog, engine: Engine) -> None:
    metadata.create_all(engine)
    subj = event_log.config.subject
    await event_log.append(ExecutionDispatched(execution_id="a", task_id="t", group_id="g"))
    await event_log.nc.publish(subj("execution", "b"), b"{oops", headers={"Og-Type": "execution-finished"})
    await event_log.nc.publish(subj("execution", "c"), b"{}", headers={"Og-Type": "execution-exploded"})
    await event_log.nc.publish(
        subj("execution", "d"), b"{}", headers={"Og-Type": "execution-finished", "Og-Version": "7"}
    )
    await event_log.nc.publish(subj("execution", "e"), b"{}", headers={})
    await event_log.append(ExecutionFinished(execution_id="a", status="completed", detail="poison"))
    await event_log.append(ExecutionFinished(execution_id="a", status="completed", score=1.0))
    await event_log.nc.flush()
    runner = ProjectionRunner(CountingProjection(), event_log, engine)
    await _run_until_caught_up(runner)
    with engine.connect() as c:
        dead = c.execute(select(DeadLetter.stream_seq, DeadLetter.reason).order_by(DeadLetter.stream_seq)).all()
        n = c.execute(select(counts.c.n).where(counts.c.aggregate_id == "a")).scalar()
        tracked = c.execute(select(func.count()).select_from(Tracking)).scalar()
    assert [tuple(r) for r in dead] == [
        (2, "malformed"),
        (3, "unknown-type"),
        (4, "newer-schema"),
        (5, "malformed"),
        (6, "rejected"),
    ]
    assert n == 2  # the events before and after the poison ones were applied
    assert tracked == 7
    st = await runner.status()
    assert st.pending == 0 and st.dead_letters == 5 and st.position == 7


async def test_redelivered_batches_are_no_ops(event_log: EventLog, engine: Engine) -> None:
    metadata.create_all(engine)
    await event_log.append_many(sample_events(20))
    stored = [s async for s in event_log.read(1)]
    fold = FoldTransaction(CountingProjection(), engine, event_log.registry)
    first = fold.fold(stored)
    again = fold.fold(stored[5:])
    assert (first.applied, first.duplicates) == (30, 0)
    assert (again.applied, again.duplicates) == (0, 25)
    with engine.connect() as c:
        assert c.execute(select(func.sum(counts.c.n))).scalar() == 30


async def test_a_transient_store_error_is_retried_and_applied_once(event_log: EventLog, engine: Engine) -> None:
    metadata.create_all(engine)
    await event_log.append_many(sample_events(40))
    runner = ProjectionRunner(CountingProjection(fail_first=2), event_log, engine, retry_delay=0.05)
    await _run_until_caught_up(runner)
    with engine.connect() as c:
        assert c.execute(select(func.sum(counts.c.n))).scalar() == 60
        assert c.execute(select(func.count()).select_from(DeadLetter)).scalar() == 0


async def test_replay_until_a_sequence_gives_the_state_as_of_that_point(event_log: EventLog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    events = sample_events(40)
    await event_log.append_many(events)
    engine = create_db_engine(f"sqlite:///{tmp_path / 'replay.db'}")
    migrate(engine)
    metadata.create_all(engine)
    n = await replay_into(CountingProjection(), event_log, engine, until_seq=25)
    assert n == 25
    expected: dict[str, int] = {}
    for e in events[:25]:
        expected[e.aggregate_id()] = expected.get(e.aggregate_id(), 0) + 1
    with engine.connect() as c:
        got = {r.aggregate_id: r.n for r in c.execute(select(counts.c.aggregate_id, counts.c.n))}
    assert got == expected
    engine.dispose()


async def test_a_runner_restarted_in_place_resumes_at_its_position(event_log: EventLog, engine: Engine) -> None:
    """Each run re-creates the durable consumer at the tracked position (right after deleting it)."""
    metadata.create_all(engine)
    runner = ProjectionRunner(CountingProjection(), event_log, engine)
    for round_ in range(4):
        await event_log.append_many(sample_events(20))
        await _run_until_caught_up(runner)
        with engine.connect() as c:
            assert c.execute(select(func.sum(counts.c.n))).scalar() == 30 * (round_ + 1)


async def test_a_restarted_nats_server_is_rejoined_and_nothing_is_lost(tmp_path, log_config) -> None:  # type: ignore[no-untyped-def]
    """The log's server goes away mid-run and comes back on the same store: the runner reconnects and resumes."""
    from opengyre.runtime import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    engine = create_db_engine(f"sqlite:///{tmp_path / 'p.db'}")
    migrate(engine)
    metadata.create_all(engine)
    log = await EventLog.connect(server.url, log_config)
    stop = asyncio.Event()
    runner = ProjectionRunner(CountingProjection(), log, engine)
    task = asyncio.create_task(runner.run(stop))
    try:
        await log.append_many(sample_events(100))
        await runner.wait_caught_up(60)
        server.stop()
        await asyncio.sleep(1.0)
        server = EmbeddedNats(tmp_path / "nats", port=server.port)
        server.start()
        for _ in range(200):  # the client reconnects on its own
            if log.nc.is_connected:
                break
            await asyncio.sleep(0.05)
        await log.append_many(sample_events(100))
        for _ in range(600):
            with engine.connect() as c:
                if c.execute(select(func.sum(counts.c.n))).scalar() == 300:
                    break
            await asyncio.sleep(0.05)
        with engine.connect() as c:
            assert c.execute(select(func.sum(counts.c.n))).scalar() == 300
            assert c.execute(select(func.count()).select_from(Tracking)).scalar() == 300
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await log.close()
        server.stop()
        engine.dispose()


class _Held(CountingProjection):
    """Blocks in ``apply`` once ``hold`` is set, so a test can act between a batch's fold and its ack."""

    def __init__(self) -> None:
        super().__init__()
        self.hold, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()
        self.left = threading.Event()  # the held apply returned (its commit and ack follow)

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        if self.hold.is_set():
            self.hold.clear()
            self.entered.set()
            self.release.wait(60)
            self.left.set()
        super().apply(tx, event, seq)


async def test_a_log_gone_between_the_commit_and_the_ack_ends_nothing(tmp_path, log_config) -> None:  # type: ignore[no-untyped-def]
    """nats-server stops answering after a batch was committed and before its ack is confirmed (the soak saw a
    SIGKILLed nats-server end a service on the flush): the runner goes on, the batch is skipped when redelivered,
    and every event is applied once."""
    from opengyre.runtime import EmbeddedNats

    server = EmbeddedNats(tmp_path / "nats")
    server.start()
    engine = create_db_engine(f"sqlite:///{tmp_path / 'p.db'}")
    migrate(engine)
    metadata.create_all(engine)
    log = await EventLog.connect(server.url, log_config)
    stop = asyncio.Event()
    projection = _Held()
    runner = ProjectionRunner(projection, log, engine, batch=1)
    task = asyncio.create_task(runner.run(stop))
    assert server.proc is not None
    try:
        await log.append_many(sample_events(10))
        await runner.wait_caught_up(60)
        projection.hold.set()
        await log.append(ExecutionDispatched(execution_id="held", task_id="t", group_id="g"))
        assert await asyncio.to_thread(projection.entered.wait, 60)
        os.kill(server.proc.pid, signal.SIGSTOP)  # the server stops answering: the flush after the ack times out
        try:
            projection.release.set()
            # Once a CI run (of ~40) got here with neither (cause not found): the state says which step stalled.
            await await_until(
                lambda: runner.unacked == 1 or task.done(),
                lambda: (
                    f"the ack failed (apply left {projection.left.is_set()}, retries {runner.retries}, "
                    f"applied {runner.applied_total})"
                ),
                polls=1200,
            )
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert not task.done(), task.exception()
        await log.append_many(sample_events(10))
        await runner.wait_caught_up(60)
        with engine.connect() as c:
            assert c.execute(select(func.sum(counts.c.n))).scalar() == 31
            assert c.execute(select(func.count()).select_from(Tracking)).scalar() == 31
    finally:
        projection.release.set()
        stop.set()
        await asyncio.wait_for(task, 30)
        await log.close()
        server.stop()
        engine.dispose()


async def test_a_corrupt_store_is_set_aside_at_start_and_rebuilt_from_the_log(event_log: EventLog, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Garbage over a projection's SQLite file: the next start (``migrate``, then the runner) moves it aside and
    folds the whole log again, to the same rows, as it does for a deleted file."""
    path = tmp_path / "p.db"
    engine = create_db_engine(f"sqlite:///{path}")
    migrate(engine)
    metadata.create_all(engine)
    projection = CountingProjection()
    events = sample_events(200)
    await event_log.append_many(events)
    await _run_until_caught_up(ProjectionRunner(projection, event_log, engine))
    live = dump_rows(engine, projection.tables)
    assert sum(r[1] for r in live["test_counts"]) == len(events)
    engine.dispose()
    garbage = os.urandom(path.stat().st_size)
    path.write_bytes(garbage)

    engine = create_db_engine(f"sqlite:///{path}")
    try:
        migrate(engine)  # what a service does first on start
        metadata.create_all(engine)
        runner, stop, last = (
            ProjectionRunner(projection, event_log, engine),
            asyncio.Event(),
            await event_log.last_seq(),
        )
        task = asyncio.create_task(runner.run(stop))
        try:
            # Not ``wait_caught_up``: the first run's consumer, with nothing pending, may still be there.
            await await_until(lambda: runner.fold.position() >= last, "the rebuilt store folded the whole log")
        finally:
            stop.set()
            await task
        assert dump_rows(engine, projection.tables) == live
        with engine.connect() as c:
            assert c.execute(select(func.count()).select_from(Tracking)).scalar() == len(events)
    finally:
        engine.dispose()
    aside = [p for p in tmp_path.glob("p.db.corrupt-*") if not p.name.endswith(("-wal", "-shm"))]
    assert len(aside) == 1 and aside[0].read_bytes() == garbage


async def test_a_store_on_a_full_disk_is_retried_in_place_and_applies_everything_once_space_returns(
    event_log: EventLog, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    """SQLite's "database or disk is full" is a transient store error: the batch is retried (opengyre.retry's
    backoff) without being acknowledged or dead-lettered, and folds once the disk has room (issue 24 item 3)."""
    import contextlib
    import subprocess

    import pytest

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], check=True)
    engine = create_db_engine(f"sqlite:///{disk / 'p.db'}")
    stop, task = asyncio.Event(), None
    try:
        migrate(engine)
        metadata.create_all(engine)
        filler = disk / "filler"
        with contextlib.suppress(OSError), filler.open("wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
        events = sample_events(300)
        await event_log.append_many(events)
        runner = ProjectionRunner(CountingProjection(), event_log, engine, retry_delay=0.05)
        task = asyncio.create_task(runner.run(stop))
        await await_until(lambda: runner.retries >= 2 or task.done(), "the full store's batch is retried", polls=1200)
        assert not task.done(), task.exception()
        with engine.connect() as c:
            assert c.execute(select(func.count()).select_from(DeadLetter)).scalar() == 0
        filler.unlink()
        last = await event_log.last_seq()
        await await_until(lambda: runner.fold.position() >= last, "folded once there is room", polls=1200)
        with engine.connect() as c:
            assert c.execute(select(func.sum(counts.c.n))).scalar() == len(events)  # each applied exactly once
            assert c.execute(select(func.count()).select_from(Tracking)).scalar() == len(events)
            assert c.execute(select(func.count()).select_from(DeadLetter)).scalar() == 0
    finally:
        try:
            stop.set()
            if task is not None:
                await task
        finally:
            engine.dispose()
            subprocess.run(["umount", "-l", str(disk)], check=True)
