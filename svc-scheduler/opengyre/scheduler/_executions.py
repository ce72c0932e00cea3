"""The executions ledger: every dispatched execution, how it ended, and which training step used it
(source of the watermark w(t) and of per-sample staleness)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Connection, DateTime, Float, Integer, String, Table, func, select, text
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.store import STREAM_SEQ, Base

__all__ = ["EXECUTIONS", "ExecutionRow", "watermark"]


class ExecutionRow(Base):
    __tablename__ = "sched_executions"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(128))
    group_id: Mapped[str] = mapped_column(String(128), index=True)
    step: Mapped[int] = mapped_column(Integer)
    weight_version: Mapped[str] = mapped_column(String(64))
    cell_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    timeout_s: Mapped[float] = mapped_column(Float)
    dispatched_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    dispatched_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    status: Mapped[str] = mapped_column(String(32), index=True)  # running | completed | timed-out | ...
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    failure_class: Mapped[str | None] = mapped_column(String(32), nullable=True)
    finished_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The policy version (training steps done) that generated it, resolved when it was dispatched.
    version_step: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    consumed_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    staleness: Mapped[int | None] = mapped_column(Integer, nullable=True)


EXECUTIONS: Table = ExecutionRow.__table__  # type: ignore[assignment]


def watermark(conn: Connection) -> int:
    """w(t) = dispatched - finished: executions still running."""
    return int(conn.execute(select(func.count()).where(EXECUTIONS.c.status == "running")).scalar() or 0)
