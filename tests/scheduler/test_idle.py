"""An idle scheduler does no work that grows with its history (issue 24 item 8): once a run's events are folded,
the controller's loop ticks and a WatchState client stays attached without one statement reaching the store
(the SQL engine's own statement hook counts them; a load of the state reads every group and scans the
executions ledger), and the watcher is sent nothing; and with no fallback period at all, the next event still
reaches the loop's advice and the watcher. ``svc-scheduler/bench/idle_cpu.py`` measures the CPU it saves."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import cast

import grpc
from sqlalchemy import event

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CellRegistered
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import SchedulerState, View
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.scheduler.sim import Simulator
from opengyre.v1 import scheduler_pb2 as pb
from opengyre.v1.scheduler_pb2_grpc import SchedulerServiceStub

from .._polling import await_until
from ._service import running_scheduler
from ._small import small_config
from .test_sim_equals_live_service import _NoMachines

Watch = grpc.aio.UnaryStreamCall[pb.WatchStateRequest, pb.SchedulerStateView]


def _watch(stub: SchedulerServiceStub) -> Watch:
    return cast(Watch, stub.WatchState(pb.WatchStateRequest()))


async def _next(watch: Watch) -> pb.SchedulerStateView:
    view = await watch.read()
    if view is grpc.aio.EOF:
        raise AssertionError("the watch ended")
    return cast(pb.SchedulerStateView, view)


async def _view_at(watch: Watch, seq: int) -> pb.SchedulerStateView:
    """The watcher's views up to the one of stream sequence ``seq``."""
    while True:
        view = await _next(watch)
        if view.seq >= seq:
            return view


async def test_an_idle_scheduler_reads_nothing_while_its_loop_ticks_and_a_watcher_waits(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    sim = Simulator(small_config(record=True), make_policy("elastic"))
    sim.run()
    # A short fallback period: the loop ticks on its own many times while nothing happens.
    svc = SchedulerService(
        policy=make_policy("elastic"), loop=sim.cfg.loop, actuator=_NoMachines(), auto=False, poll_s=0.02
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        controller = svc.controller
        assert controller is not None
        last = (await event_log.append_many(sim.events))[-1].seq
        watch = _watch(stub)
        await _view_at(watch, last)
        await await_until(lambda: controller.advice == controller.policy.decide(_folded(sim, last)), "caught up")
        statements: list[str] = []

        def count(_conn: object, _cursor: object, statement: str, *_: object) -> None:
            statements.append(statement)

        event.listen(controller.engine, "before_cursor_execute", count)
        try:
            next_view = asyncio.ensure_future(_next(watch))
            ticks = controller.ticks
            await await_until(lambda: controller.ticks >= ticks + 25, "25 ticks of the loop's fallback period")
            assert statements == [], f"{len(statements)} statements while idle, e.g. {statements[:3]}"
            assert not next_view.done(), "the watcher was sent a view while nothing happened"
            # The next event is folded, ticked on and sent, loading the state once more.
            late = CellRegistered(cell_id="late", node="n-late", gpus=8, capacity=8, role="rollout")
            seq = (await event_log.append(late)).seq
            view = await next_view
        finally:
            event.remove(controller.engine, "before_cursor_execute", count)
        assert view.seq == seq and "late" in [c.cell_id for c in view.cells]
        assert any("sched_groups" in s for s in statements)


def _folded(sim: Simulator, upto: int) -> View:
    st = SchedulerState()
    for seq, e in enumerate(sim.events[:upto], 1):
        st.apply(e, seq)
    return View(st, 0.0, sim.cfg.loop)


async def test_with_no_fallback_period_a_new_event_reaches_the_loop_and_the_watcher(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    """The loop's and the watcher's only wake-up is the projection's commit: a period longer than the test."""
    sim = Simulator(small_config(record=True, steps=3), make_policy("colocate"))
    sim.run()
    first, second = [d for d in sim.decisions if d[2].roles][:2]
    svc = SchedulerService(
        policy=make_policy("colocate"), loop=sim.cfg.loop, actuator=_NoMachines(), auto=False, poll_s=1e6
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        controller = svc.controller
        assert controller is not None
        watch = _watch(stub)
        appended = 0
        for seq, _, decision in (first, second):
            await event_log.append_many(sim.events[appended:seq])
            appended = seq
            view = await _view_at(watch, seq)
            assert view.seq == seq
            assert [(r.cell_id, r.target) for r in view.roles] == [(r.cell_id, r.target) for r in decision.roles]
            await await_until(lambda d=decision: controller.advice == d, "the loop's tick on the fold")  # type: ignore[misc]
