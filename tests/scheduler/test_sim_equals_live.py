"""The simulator and the live scheduler make the same decisions on the same event sequence, and the live
projection rebuilt from the log equals itself live, row for row."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.projection import ProjectionRunner, dump_rows, rebuild, replay_into
from opengyre.scheduler import SchedulerProjection, View, load_state
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import Simulator

from ._small import small_config


@pytest.mark.parametrize("name", ["elastic", "elastic-carry", "colocate", "async"])
async def test_live_projection_decides_like_the_simulator(name: str, event_log: EventLog, engine: Engine) -> None:
    cfg = small_config(record=True, steps=3)
    sim = Simulator(cfg, make_policy(name))
    sim.run()
    acks = await event_log.append_many(sim.events)
    assert [a.seq for a in acks] == list(range(1, len(sim.events) + 1))
    live_policy = make_policy(name)
    proj = SchedulerProjection()
    checked = 0
    for seq, now, decision in sim.decisions:
        await replay_into(proj, event_log, engine, until_seq=seq)
        with engine.connect() as conn:
            state = await asyncio.to_thread(load_state, conn, full=False)  # what the live controller loads
        assert live_policy.decide(View(state, now, cfg.loop)) == decision, (seq, decision)
        checked += 1
    assert checked >= (2 if name == "async" else 5)  # a fixed split decides little: the split, then dispatches


async def test_rebuild_equals_live(event_log: EventLog, engine: Engine) -> None:
    sim = Simulator(small_config(record=True, steps=3), make_policy("elastic"))
    sim.run()
    await event_log.append_many(sim.events)
    proj = SchedulerProjection()
    runner = ProjectionRunner(proj, event_log, engine)
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    await runner.wait_caught_up(timeout=60)
    stop.set()
    await task
    live = dump_rows(engine, proj.tables)
    with engine.connect() as conn:
        live_state = load_state(conn)
        partial = load_state(conn, full=False)
    assert live_state.snapshot() == sim.state.snapshot() == partial.snapshot()
    assert len(partial.finished) < len(live_state.finished)  # trained executions were left out
    assert live["sched_cells"] and live["sched_steps"]
    await rebuild(proj, event_log, engine)
    assert dump_rows(engine, proj.tables) == live
