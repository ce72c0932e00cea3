"""The scheduler projection: the executions ledger, cells and their roles, groups (the ready-data buffer),
published weight versions and training steps, folded into SQL by the same rules as the in-memory state."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Table, func, insert, select, update

from opengyre.aggregates import Cell, CellEvent, Execution, evolve_cell, evolve_execution
from opengyre.events import (
    CellEngineChanged,
    CellRegistered,
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    TrainingStepCompleted,
)
from opengyre.projection import Projection, Rejected, folds
from opengyre.store import Tracking

from ._executions import EXECUTIONS as _X
from ._rules import sample_staleness
from ._state import CellState, GroupState, RunningExecution, SchedulerState, as_seconds
from ._tables import CELLS as _C
from ._tables import GROUPS as _G
from ._tables import STEPS as _S
from ._tables import VERSIONS as _V

__all__ = ["SchedulerProjection", "load_state"]


class SchedulerProjection(Projection):
    name = "scheduler"
    aggregates = ("execution", "cell", "training")

    @property
    def tables(self) -> Sequence[Table]:
        return (_S, _V, _G, _C, _X)

    def _execution(self, tx: Connection, execution_id: str) -> Execution | None:
        row = tx.execute(select(_X.c.status).where(_X.c.execution_id == execution_id)).first()
        return None if row is None else Execution(execution_id, finished=row.status != "running", status=row.status)

    @folds(ExecutionDispatched)
    def _dispatched(self, tx: Connection, e: ExecutionDispatched, seq: int) -> None:
        evolve_execution(self._execution(tx, e.execution_id), e, seq)  # the one rule; it raises Rejected
        vstep = tx.execute(select(_V.c.step).where(_V.c.weight_version == e.weight_version)).scalar() or 0
        tx.execute(
            insert(_X).values(
                execution_id=e.execution_id,
                task_id=e.task_id,
                group_id=e.group_id,
                step=e.step,
                weight_version=e.weight_version,
                cell_id=e.cell_id,
                timeout_s=e.timeout_s,
                dispatched_seq=seq,
                dispatched_at=e.occurred_at,
                status="running",
                version_step=vstep,
            )
        )
        g = tx.execute(select(_G.c.size).where(_G.c.group_id == e.group_id)).first()
        if g is None:
            tx.execute(
                insert(_G).values(
                    group_id=e.group_id, step=e.step, version_step=vstep, size=e.group_size, dispatched=1, finished=0,
                    valid=0, last_finished_at=None, complete_seq=None, consumed_step=None,
                )
            )  # fmt: skip
        else:
            # A late member makes a complete group incomplete again: it leaves the ready buffer.
            tx.execute(
                update(_G)
                .where(_G.c.group_id == e.group_id)
                .values(dispatched=_G.c.dispatched + 1, size=max(int(g.size), e.group_size), complete_seq=None)
            )

    @folds(ExecutionFinished)
    def _finished(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        evolve_execution(self._execution(tx, e.execution_id), e, seq)  # the one rule; it raises Rejected
        row = tx.execute(select(_X.c.group_id).where(_X.c.execution_id == e.execution_id)).one()
        outcome = {"status": e.status, "score": e.score, "failure_class": e.failure_class}
        tx.execute(
            update(_X)
            .where(_X.c.execution_id == e.execution_id)
            .values(**outcome, finished_seq=seq, finished_at=e.occurred_at)
        )
        g = tx.execute(select(_G).where(_G.c.group_id == row.group_id)).one()
        finished = int(g.finished) + 1
        complete = finished == int(g.dispatched) and finished >= max(int(g.size), 1)
        values: dict[str, object] = {
            "finished": finished,
            "valid": int(g.valid) + (e.score is not None),
            "last_finished_at": e.occurred_at,
        }
        if complete and g.consumed_step is None:
            values["complete_seq"] = seq
        tx.execute(update(_G).where(_G.c.group_id == row.group_id).values(**values))

    @folds(CellRegistered)
    def _registered(self, tx: Connection, e: CellRegistered, seq: int) -> None:
        self._cell_event(tx, e, seq)

    @folds(CellRoleChanged)
    def _role_changed(self, tx: Connection, e: CellRoleChanged, seq: int) -> None:
        self._cell_event(tx, e, seq)

    @folds(CellEngineChanged)
    def _engine_changed(self, tx: Connection, e: CellEngineChanged, seq: int) -> None:
        self._cell_event(tx, e, seq)

    def _cell_event(self, tx: Connection, e: CellEvent, seq: int) -> None:
        """The cell aggregate's rule (``evolve_cell``) over the cell's row: read it, evolve it, write it back."""
        row = tx.execute(select(_C).where(_C.c.cell_id == e.cell_id)).first()
        cell = evolve_cell(_cell_of(row) if row is not None else None, e, seq)
        values: dict[str, object] = {
            "role": cell.role, "engine_url": cell.engine_url, "switch_from": cell.switch_from, "role_seq": cell.seq,
            "role_since": cell.since,
        }  # fmt: skip
        if row is not None:
            tx.execute(update(_C).where(_C.c.cell_id == e.cell_id).values(**values))
            return
        ordinal = int(tx.execute(select(func.count()).select_from(_C)).scalar() or 0)
        tx.execute(
            insert(_C).values(
                cell_id=cell.cell_id, node=cell.node, gpus=cell.gpus, capacity=cell.capacity, resident=cell.resident,
                ordinal=ordinal, registered_seq=seq, **values,
            )
        )  # fmt: skip

    @folds(TrainingStepCompleted)
    def _step_completed(self, tx: Connection, e: TrainingStepCompleted, seq: int) -> None:
        top = tx.execute(select(func.max(_S.c.step))).scalar()
        if e.step <= int(top or 0):
            raise Rejected(f"training step {e.step} is not after step {int(top or 0)}")
        if e.weight_version and tx.execute(select(_V.c.step).where(_V.c.weight_version == e.weight_version)).first():
            raise Rejected(f"weight version {e.weight_version} was already published")
        stale: list[int] = []
        trained = dict.fromkeys(e.execution_ids)
        for xid in [x for x in e.dropped if x not in trained]:  # consumed without training (see SchedulerState)
            r = tx.execute(
                select(_X.c.group_id).where(
                    _X.c.execution_id == xid, _X.c.status != "running", _X.c.consumed_step.is_(None)
                )
            ).first()
            if r is None:
                continue
            tx.execute(update(_X).where(_X.c.execution_id == xid).values(consumed_step=e.step))
            tx.execute(
                update(_G).where(_G.c.group_id == r.group_id, _G.c.consumed_step.is_(None)).values(consumed_step=e.step)
            )
        for xid in trained:
            r = tx.execute(
                select(_X.c.group_id, _X.c.version_step).where(
                    _X.c.execution_id == xid, _X.c.status != "running", _X.c.consumed_step.is_(None)
                )
            ).first()
            if r is None:
                continue  # still running, never seen, or already trained on
            d = sample_staleness(e.step, int(r.version_step))
            stale.append(d)
            tx.execute(update(_X).where(_X.c.execution_id == xid).values(consumed_step=e.step, staleness=d))
            tx.execute(
                update(_G).where(_G.c.group_id == r.group_id, _G.c.consumed_step.is_(None)).values(consumed_step=e.step)
            )
        tx.execute(
            insert(_S).values(
                step=e.step, run_id=e.run_id, weight_version=e.weight_version, n_samples=len(stale),
                staleness_mean=sum(stale) / len(stale) if stale else 0.0, staleness_max=max(stale, default=0),
                completed_seq=seq, completed_at=e.occurred_at,
            )
        )  # fmt: skip
        if e.weight_version:  # a step that updated nothing published no weights
            tx.execute(insert(_V).values(weight_version=e.weight_version, step=e.step))


def _cell_of(row: Row[Any]) -> Cell:
    return Cell(
        row.cell_id, cast(CellRole, row.role), row.engine_url, bool(row.resident), row.node, row.gpus, row.capacity,
        cast(CellRole | None, row.switch_from), row.role_since, "", row.role_seq,
    )  # fmt: skip


def _secs(ts: datetime | None) -> float:
    return as_seconds(ts) if ts is not None else 0.0


def load_state(conn: Connection, projection: str = SchedulerProjection.name, *, full: bool = True) -> SchedulerState:
    """The in-memory state the policies read, loaded from the projection's rows.

    ``full=False`` (the live controller, every tick) leaves out executions already trained on: no decision and
    no later event can depend on them, and a long run has tens of thousands. Counts and the staleness
    histogram still cover them (SQL aggregates); ``snapshot()`` equals the full load's except ``finished``.
    """
    st = SchedulerState()
    for c in conn.execute(select(_C).order_by(_C.c.ordinal)):
        role = cast(CellRole, c.role)
        st.cells[c.cell_id] = CellState(
            c.cell_id, c.node, c.gpus, c.capacity, role, c.engine_url, bool(c.resident), c.ordinal, c.role_seq,
            _secs(c.role_since), cast(CellRole | None, c.switch_from),
        )  # fmt: skip
    rows = select(_X).order_by(_X.c.dispatched_seq)
    if not full:
        rows = rows.where(_X.c.consumed_step.is_(None))
        st.dispatched_total, st.finished_total = _trained_counts(conn)
        for d, n in conn.execute(
            select(_X.c.staleness, func.count()).where(_X.c.staleness.is_not(None)).group_by(_X.c.staleness)
        ):
            st.staleness_hist[int(d)] = int(n)
            st.consumed_samples += int(n)
    for x in conn.execute(rows):
        st.dispatched_total += 1
        if x.status == "running":
            st.running[x.execution_id] = RunningExecution(
                x.execution_id, x.group_id, x.step, x.version_step, _secs(x.dispatched_at), x.timeout_s
            )
            continue
        st.finished_total += 1
        st.finished[x.execution_id] = (x.group_id, x.version_step, x.consumed_step)
        if full and x.staleness is not None:
            st.staleness_hist[x.staleness] = st.staleness_hist.get(x.staleness, 0) + 1
            st.consumed_samples += 1
    ready: list[tuple[int, str]] = []
    for g in conn.execute(select(_G)):
        st.groups[g.group_id] = GroupState(
            g.group_id, g.step, g.version_step, g.size, g.dispatched, g.finished, g.valid,
            _secs(g.last_finished_at), g.consumed_step,
        )  # fmt: skip
        if g.complete_seq is not None and g.consumed_step is None:
            ready.append((int(g.complete_seq), g.group_id))
        st.consumed_groups += g.consumed_step is not None
    st.restore_derived(ready_in_order=[gid for _, gid in sorted(ready)])
    for v in conn.execute(select(_V)):
        st.versions[v.weight_version] = v.step
    st.trained_step = int(conn.execute(select(func.max(_S.c.step))).scalar() or 0)
    st.dispatched_step = int(conn.execute(select(func.max(_X.c.step))).scalar() or 0)
    st.last_seq = int(
        conn.execute(select(func.max(Tracking.stream_seq)).where(Tracking.projection == projection)).scalar() or 0
    )
    # A loaded state has no history of buffer changes: any new event may have changed it, so rescan then.
    st.ready_rev = st.last_seq
    return st


def _trained_counts(conn: Connection) -> tuple[int, int]:
    """(dispatched, finished) among executions already trained on (all of them finished)."""
    n = int(conn.execute(select(func.count()).where(_X.c.consumed_step.is_not(None))).scalar() or 0)
    return n, n
