"""The running ``SchedulerService`` (its own projection runner folding a real NATS log, its controller's loop
step) advises what the simulator decided, decision point by decision point, on one scripted workload: the
simulator's run is appended to the log event by event and, at each point where the simulator decided, the live
controller's ``tick()`` must give the same decision.

Not yet covered here (issue 25): the live service *carrying out* the role changes (actuator, command checks)
in place of the simulator's recorded role-change events; the live actuator finishes a switch at once where the
simulator spends the move's cost, so the two interleave other events differently."""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.eventlog import EventLog, LogConfig
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import CellState
from opengyre.scheduler.actuators import Actuator
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.scheduler.sim import Simulator

from .._polling import await_until
from ._service import running_scheduler
from ._small import small_config


class _NoMachines(Actuator):
    """No cell is ever switched here (advice only, auto off): any call is a failure of the test's premise."""

    name = "none"

    async def release_engine(self, cell: CellState) -> None:
        raise AssertionError(f"advice only: {cell.cell_id} was actuated")

    async def start_trainer(self, cell: CellState, *, core: bool) -> None:
        raise AssertionError(f"advice only: {cell.cell_id} was actuated")

    async def stop_trainer(self, cell: CellState) -> None:
        raise AssertionError(f"advice only: {cell.cell_id} was actuated")

    async def start_engine(self, cell: CellState) -> str | None:
        raise AssertionError(f"advice only: {cell.cell_id} was actuated")


@pytest.mark.parametrize("name", ["elastic", "elastic-carry", "colocate", "async"])
async def test_the_running_service_advises_what_the_simulator_decided(
    name: str, nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    cfg = small_config(record=True, steps=3)
    sim = Simulator(cfg, make_policy(name))
    sim.run()
    # A loop period longer than any test: the loop's first tick runs at start, every later one is the test's.
    svc = SchedulerService(policy=make_policy(name), loop=cfg.loop, actuator=_NoMachines(), auto=False, poll_s=1e6)
    async with running_scheduler(svc, nats_server, log_config, tmp_path):
        controller = svc.controller
        assert controller is not None
        appended = 0
        for seq, _, decision in sim.decisions:
            if seq > appended:
                acks = await event_log.append_many(sim.events[appended:seq])
                assert acks[-1].seq == seq
                appended = seq
            await controller.fresh_state()  # the service's runner has folded the log up to seq
            assert await controller.tick() == decision, (seq, decision)
    assert len(sim.decisions) >= (2 if name == "async" else 5)


async def test_the_service_loop_ticks_when_its_projection_folds_not_only_every_poll(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    """The loop's period is longer than the test, so only a tick woken by the fold can reach the simulator's
    first role-changing decision (before: a tick every poll_s only, and a trainer could train a ready step
    before the policy saw it: tests/e2e/test_closed_loop.py's order of events)."""
    cfg = small_config(record=True, steps=3)
    sim = Simulator(cfg, make_policy("colocate"))
    sim.run()
    seq, _, decision = next(d for d in sim.decisions if d[2].roles)
    svc = SchedulerService(
        policy=make_policy("colocate"), loop=cfg.loop, actuator=_NoMachines(), auto=False, poll_s=1e6
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path):
        controller = svc.controller
        assert controller is not None
        assert controller.advice != decision  # the start's tick saw an empty log
        await event_log.append_many(sim.events[:seq])
        await await_until(lambda: controller.advice == decision, "the loop's own tick after the fold")
