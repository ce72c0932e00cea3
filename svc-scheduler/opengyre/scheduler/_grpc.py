"""Protobuf views of the scheduler's state and the mapping of refusals to gRPC status codes."""

from __future__ import annotations

import grpc

from opengyre.v1 import scheduler_pb2 as pb

from ._commands import RefusalCode
from ._policy import Decision
from ._state import CellState, SchedulerState

__all__ = ["STATUS", "cell_pb", "state_pb"]

STATUS: dict[RefusalCode, grpc.StatusCode] = {
    "not-found": grpc.StatusCode.NOT_FOUND,
    "failed-precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "already-exists": grpc.StatusCode.ALREADY_EXISTS,
    "invalid-argument": grpc.StatusCode.INVALID_ARGUMENT,
    "resource-exhausted": grpc.StatusCode.RESOURCE_EXHAUSTED,
}


def cell_pb(c: CellState) -> pb.CellInfo:
    return pb.CellInfo(
        cell_id=c.cell_id, node=c.node, gpus=c.gpus, capacity=c.capacity, role=c.role, engine_url=c.engine_url or "",
        resident=c.resident, order=c.order, switch_from=c.switch_from or "",
    )  # fmt: skip


def state_pb(st: SchedulerState, advice: Decision, *, policy: str, auto: bool) -> pb.SchedulerStateView:
    return pb.SchedulerStateView(
        seq=st.last_seq,
        cells=[cell_pb(c) for c in st.cells_in_order()],
        watermark=st.watermark,
        rollout_capacity=st.rollout_capacity,
        dispatched_total=st.dispatched_total,
        finished_total=st.finished_total,
        ready_samples=st.ready_samples,
        ready_groups=len(st.ready_groups()),
        trained_step=st.trained_step,
        dispatched_step=st.dispatched_step,
        staleness_mean=st.staleness_mean(),
        staleness_max=st.staleness_max(),
        policy=policy,
        auto=auto,
        dispatch=[pb.DispatchAdvice(step=d.step, groups=d.groups) for d in advice.dispatch],
        roles=[pb.RoleAdvice(cell_id=r.cell_id, target=r.target, reason=r.reason) for r in advice.roles],
    )
