"""DispatchGroups: the scheduler places a step's groups on rollout cells with room and appends their
``execution-dispatched`` itself; a repeated group is answered as placed; the staleness bound and the cells'
capacity refuse what cannot start now, appending nothing."""

from __future__ import annotations

from pathlib import Path

import grpc

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished, TrainingStepCompleted
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.actuators import ExternalActuator
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.v1 import scheduler_pb2 as pb

from ._service import running_scheduler


def group(gid: str, size: int = 2, task: str = "t") -> pb.GroupRequest:
    return pb.GroupRequest(group_id=gid, task_id=task, task_version=3, group_size=size)


async def refused(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    raise AssertionError("the call was not refused")


async def dispatched(log: EventLog) -> list[ExecutionDispatched]:
    out = []
    async for s in log.read():
        e = log.decode(s)
        if isinstance(e, ExecutionDispatched):
            out.append(e)
    return out


async def test_groups_go_to_cells_with_room_for_the_step_the_policy_allows(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    svc = SchedulerService(
        policy=make_policy("colocate"),
        loop=LoopConfig(steps=3, groups_per_step=2, group_size=2, max_lag=0),
        actuator=ExternalActuator(),
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for c in ("c0", "c1"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=2, engine_url=f"http://{c}:1"))
        first = await stub.DispatchGroups(pb.DispatchGroupsRequest(groups=[group("g0")], timeout_s=60))
        assert first.step == 1 and first.weight_version == "default" and first.seq > 0
        assert [(e.execution_id, e.cell_id, e.engine_url, e.task_version) for e in first.executions] == [
            ("g0-m0", "c0", "http://c0:1", 3),
            ("g0-m1", "c1", "http://c1:1", 3),  # the least loaded cell takes the next member
        ]
        # A retry of the same group (its reply lost) gets the same members, and nothing is appended.
        last = await event_log.last_seq()
        again = await stub.DispatchGroups(pb.DispatchGroupsRequest(groups=[group("g0")], timeout_s=60))
        assert again.seq == 0 and [e.execution_id for e in again.executions] == ["g0-m0", "g0-m1"]
        assert await event_log.last_seq() == last

        def ask(*groups: pb.GroupRequest) -> object:
            return stub.DispatchGroups(pb.DispatchGroupsRequest(groups=list(groups), timeout_s=60))

        # Two slots are left: a group of 3 must wait; bad requests are refused; none appends anything.
        assert await refused(ask(group("g1", 3))) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert await refused(ask()) == grpc.StatusCode.INVALID_ARGUMENT
        assert await refused(ask(group("g1", task=""))) == grpc.StatusCode.INVALID_ARGUMENT
        for timeout in (float("nan"), float("inf"), 0.0):  # a NaN became a null every projection dead-letters
            req = stub.DispatchGroups(pb.DispatchGroupsRequest(groups=[group("g1")], timeout_s=timeout))
            assert await refused(req) == grpc.StatusCode.INVALID_ARGUMENT
        assert await refused(ask(group("g1"), group("g2"))) == grpc.StatusCode.FAILED_PRECONDITION  # step 1 holds 2
        assert await event_log.last_seq() == last
        second = await ask(group("g1"))
        assert second.step == 1 and {e.cell_id for e in second.executions} == {"c0", "c1"}  # type: ignore[attr-defined]
        # Step 1's batch is whole; on-policy (max_lag 0), step 2 waits until step 1 is trained.
        members = [f"g{g}-m{i}" for g in (0, 1) for i in (0, 1)]
        await event_log.append_many([ExecutionFinished(execution_id=x, status="completed", score=1.0) for x in members])
        await svc.controller.wait_applied(await event_log.last_seq())  # type: ignore[union-attr]
        assert await refused(ask(group("g2"))) == grpc.StatusCode.FAILED_PRECONDITION
        # Step 1 dropped every member (no learning signal): it updated and published nothing, and still consumed
        # the groups, so the policy lets step 2 start (on the same weights).
        await event_log.append(
            TrainingStepCompleted(
                run_id="r", step=1, weight_version="", loss=0.0, n_samples=0, n_tokens=0,
                dropped={x: "no-signal" for x in members},
            )
        )  # fmt: skip
        await svc.controller.wait_applied(await event_log.last_seq())  # type: ignore[union-attr]
        third = await ask(group("g2"))
        assert third.step == 2 and third.weight_version == "default"  # type: ignore[attr-defined]

    events = await dispatched(event_log)
    assert [(e.execution_id, e.step, e.cell_id, e.group_size, e.timeout_s) for e in events] == [
        ("g0-m0", 1, "c0", 2, 60.0),
        ("g0-m1", 1, "c1", 2, 60.0),
        ("g1-m0", 1, "c0", 2, 60.0),
        ("g1-m1", 1, "c1", 2, 60.0),
        ("g2-m0", 2, "c0", 2, 60.0),
        ("g2-m1", 2, "c1", 2, 60.0),
    ]
    assert {e.weight_version for e in events} == {"default"}
