"""The trainer's projection: executions, their trajectory calls, steps and published weights.

It validates as it folds. A call that cannot be a node of its execution's tree (unknown execution, unknown
parent, a prefix past the parent's tokens, mismatched output/logprob lengths, impossible logprobs), a finish
for an unknown or finished execution, or a step that consumes something unknown or consumed is rejected with
a reason: dead-lettered by the runner, never trained on. An execution with a rejected call is corrupt (see
``TrainerStore.corrupt``). A call whose tokens are in the payload store is checked here for what its event
carries (lengths, prefix, spans) and for its ids and logprobs when a step reads the payload.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from sqlalchemy import Connection, Table, func, insert, select, update

from opengyre.aggregates import Cell, CellEvent, Execution, evolve_cell, evolve_execution
from opengyre.events import (
    CellEngineChanged,
    CellRegistered,
    CellRole,
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    PayloadsCompacted,
    TrainingStepCompleted,
    WeightsPublished,
)
from opengyre.projection import Projection, Rejected, folds
from opengyre.trajectory import CallRejected, call_row, check_call

from ._admission import ExecutionOutcome, classify_outcome
from ._tables import CallRow, EngineRow, ExecutionRow, StepRow, WeightsRow

__all__ = ["TrainerProjection", "TrajectoryRejected"]

_E = cast(Table, ExecutionRow.__table__)
_C = cast(Table, CallRow.__table__)
_S = cast(Table, StepRow.__table__)
_W = cast(Table, WeightsRow.__table__)
_N = cast(Table, EngineRow.__table__)


class TrajectoryRejected(Rejected):
    """A refused event with a precise reason (stored in the dead letter's ``reason`` column)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail, reason=reason)


def _view(row: ExecutionRow) -> Execution:
    """The aggregate's view of an execution row (what ``evolve_execution`` reads)."""
    return Execution(row.execution_id, finished=row.status != "running", status=row.status, score=row.score)


class TrainerProjection(Projection):
    name = "trainer"
    aggregates = ("execution", "training", "weights", "cell")

    @property
    def tables(self) -> Sequence[Table]:
        return [_C, _E, _S, _W, _N]

    @folds(CellRegistered)
    def _registered(self, tx: Connection, e: CellRegistered, seq: int) -> None:
        self._cell(tx, e, seq)

    @folds(CellRoleChanged)
    def _role_changed(self, tx: Connection, e: CellRoleChanged, seq: int) -> None:
        self._cell(tx, e, seq)

    @folds(CellEngineChanged)
    def _engine_changed(self, tx: Connection, e: CellEngineChanged, seq: int) -> None:
        self._cell(tx, e, seq)

    def _execution(self, tx: Connection, execution_id: str) -> ExecutionRow | None:
        row = tx.execute(select(_E).where(_E.c.execution_id == execution_id)).first()
        return row  # type: ignore[return-value]

    @folds(ExecutionDispatched)
    def _dispatched(self, tx: Connection, e: ExecutionDispatched, seq: int) -> None:
        ex = self._execution(tx, e.execution_id)
        evolve_execution(_view(ex) if ex is not None else None, e, seq)  # the one rule; it raises Rejected
        tx.execute(
            insert(_E).values(
                execution_id=e.execution_id,
                task_id=e.task_id,
                group_id=e.group_id,
                group_size=max(int(e.group_size), 0),
                weight_version=e.weight_version,
                dispatched_seq=seq,
                status="running",
                verdict="pending",
                reason="",
                n_calls=0,
                n_generated=0,
            )
        )

    @folds(ModelCallRecorded)
    def _call(self, tx: Connection, e: ModelCallRecorded, seq: int) -> None:
        ex = self._execution(tx, e.execution_id)
        if ex is None:
            raise TrajectoryRejected("unknown-execution", f"call {e.call_id} for unknown execution {e.execution_id}")
        # A call may follow its execution's finish in the log: the proxy answers a call once it is in its durable
        # outbox and hands it to the log after, so the finish a runtime appends when the harness ends can overtake
        # the last calls (the soak saw it for a third of executions). A runtime that seals the execution first
        # (ProxyService.SealExecution) puts the proxy's count in the finish: calls up to it are the execution's
        # (the step waits for them; one that dropped the execution meanwhile has fixed samples, the call is still
        # recorded), one past it is not. Only a finish without a count (older logs) keeps the old rule: a call
        # belongs to the execution until a step has consumed it, and is refused after.
        sealed_count = ex.recorded_calls if ex.status != "running" else None
        if sealed_count is not None and ex.n_calls >= sealed_count:
            raise TrajectoryRejected(
                "call-after-seal",
                f"call {e.call_id} of {e.execution_id} past the {sealed_count} calls its finish counted",
            )
        if sealed_count is None and ex.consumed_step is not None:
            raise TrajectoryRejected(
                "call-after-consumed", f"call {e.call_id} after step {ex.consumed_step} consumed {e.execution_id}"
            )
        known = tx.execute(select(_C.c.call_id, _C.c.n_tokens).where(_C.c.execution_id == e.execution_id)).all()
        tokens = {r.call_id: r.n_tokens for r in known}
        try:
            check_call(e, known=tokens)
        except CallRejected as exc:
            raise TrajectoryRejected(exc.reason, str(exc)) from exc
        tx.execute(insert(_C).values(**call_row(e, seq), ordinal=len(tokens)))
        tx.execute(
            update(_E)
            .where(_E.c.execution_id == e.execution_id)
            .values(n_calls=_E.c.n_calls + 1, n_generated=_E.c.n_generated + e.n_output)
        )

    @folds(PayloadsCompacted)
    def _compacted(self, tx: Connection, e: PayloadsCompacted, seq: int) -> None:
        if self._execution(tx, e.execution_id) is None:
            raise TrajectoryRejected("unknown-execution", f"payloads of unknown execution {e.execution_id} compacted")
        tx.execute(
            update(_C)
            .where(
                _C.c.execution_id == e.execution_id,
                _C.c.payload_digest.is_not(None),
                _C.c.compacted_seq.is_(None),
                _C.c.seq < seq,
            )
            .values(compacted_seq=seq)
        )
        tx.execute(update(_E).where(_E.c.execution_id == e.execution_id).values(compacted_seq=seq))

    @folds(ExecutionFinished)
    def _finished(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        found = self._execution(tx, e.execution_id)
        evolve_execution(_view(found) if found is not None else None, e, seq)  # the one rule; it raises Rejected
        assert found is not None
        ex = found
        verdict, reason = classify_outcome(
            ExecutionOutcome(e.execution_id, ex.group_id, e.status, e.score, e.failure_class)
        )
        tx.execute(
            update(_E)
            .where(_E.c.execution_id == e.execution_id)
            .values(
                status=e.status,
                score=e.score,
                failure_class=e.failure_class,
                exit_code=e.exit_code,
                verdict=verdict,
                reason=reason[:64],
                finished_seq=seq,
                recorded_calls=e.recorded_calls,
            )
        )

    @folds(TrainingStepCompleted)
    def _step(self, tx: Connection, e: TrainingStepCompleted, seq: int) -> None:
        if tx.execute(select(_S.c.step).where(_S.c.run_id == e.run_id, _S.c.step == e.step)).first() is not None:
            raise TrajectoryRejected("duplicate-step", f"step {e.step} of run {e.run_id} already recorded")
        consumed = {x: "train" for x in e.execution_ids} | {k: v for k, v in e.dropped.items()}
        rows = {r.execution_id: r for r in tx.execute(select(_E).where(_E.c.execution_id.in_(list(consumed)))).all()}
        for x in sorted(consumed):
            r = rows.get(x)
            if r is None:
                raise TrajectoryRejected("unknown-execution", f"step {e.step} consumed unknown execution {x}")
            if r.status == "running":
                raise TrajectoryRejected("consumed-unfinished", f"step {e.step} consumed running execution {x}")
            if r.consumed_step is not None:
                raise TrajectoryRejected("already-consumed", f"{x} was consumed by step {r.consumed_step}")
        for x in sorted(consumed):
            tx.execute(
                update(_E)
                .where(_E.c.execution_id == x)
                .values(consumed_run=e.run_id, consumed_step=e.step, consumed_as=consumed[x][:96])
            )
        scores = [rows[x].score for x in e.execution_ids if rows[x].score is not None]
        tx.execute(
            insert(_S).values(
                run_id=e.run_id,
                step=e.step,
                weight_version=e.weight_version,
                loss=e.loss,
                n_samples=e.n_samples,
                n_tokens=e.n_tokens,
                n_trained=len(e.execution_ids),
                n_dropped=len(e.dropped),
                staleness_mean=e.staleness_mean,
                staleness_max=e.staleness_max,
                grad_norm=e.metrics.get("grad_norm"),
                reward_mean=(math.fsum(scores) / len(scores)) if scores else None,
                seq=seq,
            )
        )

    def _cell(self, tx: Connection, e: CellEvent, seq: int) -> None:
        """The cell aggregate's rule (``evolve_cell``) over the few fields the trainer keeps of a cell."""
        row = tx.execute(select(_N).where(_N.c.cell_id == e.cell_id)).first()
        old = None
        if row is not None:
            old = Cell(row.cell_id, cast(CellRole, row.role), row.engine_url, bool(row.resident), seq=row.seq)
        cell = evolve_cell(old, e, seq)
        values = {"engine_url": cell.engine_url, "role": cell.role, "seq": seq}
        if row is None:
            tx.execute(insert(_N).values(cell_id=cell.cell_id, resident=cell.resident, **values))
        else:
            tx.execute(update(_N).where(_N.c.cell_id == e.cell_id).values(**values))

    @folds(WeightsPublished)
    def _weights(self, tx: Connection, e: WeightsPublished, seq: int) -> None:
        dup = tx.execute(
            select(func.count()).where(_W.c.run_id == e.run_id, _W.c.weight_version == e.weight_version)
        ).scalar()
        if dup:
            raise TrajectoryRejected("duplicate-version", f"{e.weight_version} of run {e.run_id} already published")
        tx.execute(
            insert(_W).values(
                run_id=e.run_id, weight_version=e.weight_version, step=e.step, uri=e.uri, digest=e.digest, seq=seq
            )
        )
