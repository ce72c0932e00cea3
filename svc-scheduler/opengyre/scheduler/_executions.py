"""The executions ledger: every dispatched execution and how it ended (source of the watermark w(t))."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import BigInteger, Connection, DateTime, Float, Integer, String, Table, func, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.events import Event, ExecutionDispatched, ExecutionFinished
from opengyre.projection import Projection, Rejected
from opengyre.store import Base

__all__ = ["ExecutionRow", "ExecutionsProjection", "watermark"]

_SEQ = BigInteger().with_variant(Integer, "sqlite")


class ExecutionRow(Base):
    __tablename__ = "sched_executions"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(128))
    group_id: Mapped[str] = mapped_column(String(128), index=True)
    step: Mapped[int] = mapped_column(Integer)
    weight_version: Mapped[str] = mapped_column(String(64))
    cell_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    timeout_s: Mapped[float] = mapped_column(Float)
    dispatched_seq: Mapped[int] = mapped_column(_SEQ)
    dispatched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(32), index=True)  # running | completed | timed-out | ...
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    finished_seq: Mapped[int | None] = mapped_column(_SEQ, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


_T: Table = ExecutionRow.__table__  # type: ignore[assignment]


class ExecutionsProjection(Projection):
    name = "executions"
    aggregates = ("execution",)
    event_types = frozenset({"execution-dispatched", "execution-finished"})

    @property
    def tables(self) -> Sequence[Table]:
        return (_T,)

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        if isinstance(event, ExecutionDispatched):
            if tx.execute(select(_T.c.execution_id).where(_T.c.execution_id == event.execution_id)).first():
                raise Rejected(f"execution {event.execution_id} was already dispatched")
            tx.execute(insert(_T).values(**self._dispatched_row(event, seq)))
        elif isinstance(event, ExecutionFinished):
            res = tx.execute(
                update(_T)
                .where(_T.c.execution_id == event.execution_id, _T.c.status == "running")
                .values(
                    status=event.status,
                    score=event.score,
                    failure_class=event.failure_class,
                    finished_seq=seq,
                    finished_at=event.occurred_at,
                )
            )
            if res.rowcount != 1:
                known = tx.execute(select(_T.c.status).where(_T.c.execution_id == event.execution_id)).scalar()
                if known is None:
                    raise Rejected(f"execution {event.execution_id} finished but was never dispatched")
                raise Rejected(f"execution {event.execution_id} already finished ({known})")

    @staticmethod
    def _dispatched_row(e: ExecutionDispatched, seq: int) -> dict[str, object]:
        return {
            "execution_id": e.execution_id,
            "task_id": e.task_id,
            "group_id": e.group_id,
            "step": e.step,
            "weight_version": e.weight_version,
            "cell_id": e.cell_id,
            "timeout_s": e.timeout_s,
            "dispatched_seq": seq,
            "dispatched_at": e.occurred_at,
            "status": "running",
        }


def watermark(conn: Connection) -> int:
    """w(t) = dispatched - finished: executions still running."""
    return int(conn.execute(select(func.count()).where(_T.c.status == "running")).scalar() or 0)
