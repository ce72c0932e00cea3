"""A role change is appended on the cell's stream position as it was read: a change someone else made to the
cell in between refuses it, and nothing is appended."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import CellRegistered, CellRoleChanged
from opengyre.projection import ProjectionRunner, replay_into
from opengyre.scheduler import CommandRefused, LoopConfig, SchedulerController, SchedulerProjection
from opengyre.scheduler.actuators import ExternalActuator
from opengyre.scheduler.policies import make_policy


async def test_a_role_change_read_before_another_writer_is_refused(event_log: EventLog, engine: Engine) -> None:
    await event_log.append(CellRegistered(cell_id="c0", capacity=4, role="rollout"))
    await replay_into(SchedulerProjection(), event_log, engine)
    # Another writer moves the cell after the projection was read, and the controller judges on that read.
    racing = await event_log.append(
        CellRoleChanged(cell_id="c0", from_role="rollout", to_role="draining", reason="someone else")
    )
    # A runner that is not running: the stale read stays stale (the log refuses the append before it is waited on).
    idle = ProjectionRunner(SchedulerProjection(), event_log, engine)
    with pytest.raises(CommandRefused, match="changed since it was read") as info:
        await SchedulerController(
            engine=engine, log=event_log, policy=make_policy("elastic"), loop=LoopConfig(),
            actuator=ExternalActuator(), applied=idle.applied,
        ).drain_cell("c0", "operator")  # fmt: skip
    assert info.value.code == "failed-precondition"
    assert (await event_log.last_seq()) == racing.seq  # nothing appended behind it


async def test_a_controller_without_a_live_runner_refuses_commands_with_nothing_appended(
    event_log: EventLog, engine: Engine
) -> None:
    """Its commands would have to poll the tracking rows for another process's fold: refused before appending."""
    await event_log.append(CellRegistered(cell_id="c0", capacity=4, role="rollout"))
    await replay_into(SchedulerProjection(), event_log, engine)
    last = await event_log.last_seq()
    with pytest.raises(CommandRefused, match="no live runner of projection scheduler") as info:
        await SchedulerController(
            engine=engine, log=event_log, policy=make_policy("elastic"), loop=LoopConfig(),
            actuator=ExternalActuator(),
        ).drain_cell("c0", "operator")  # fmt: skip
    assert info.value.code == "failed-precondition"
    assert (await event_log.last_seq()) == last


async def test_a_role_change_on_the_current_position_goes_through(event_log: EventLog, engine: Engine) -> None:
    await event_log.append(CellRegistered(cell_id="c0", capacity=4, role="rollout"))
    runner = ProjectionRunner(SchedulerProjection(), event_log, engine)
    stop = asyncio.Event()
    live = asyncio.create_task(runner.run(stop))
    try:
        ctl = SchedulerController(
            engine=engine, log=event_log, policy=make_policy("elastic"), loop=LoopConfig(),
            actuator=ExternalActuator(), caught_up=runner.wait_caught_up, applied=runner.applied,
        )  # fmt: skip
        out = await ctl.drain_cell("c0", "operator")
    finally:
        stop.set()
        await live
    assert out.steps == ["c0: rollout->draining", "c0: draining->idle"]
    assert out.cell.role == "idle"
