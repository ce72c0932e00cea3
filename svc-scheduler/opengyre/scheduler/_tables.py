"""The scheduler projection's other tables: cells, groups, published weight versions, training steps."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import Boolean, DateTime, Float, Integer, String, Table
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.store import STREAM_SEQ, Base

__all__ = ["CELLS", "GROUPS", "STEPS", "VERSIONS", "CellRow", "GroupRow", "StepRow", "VersionRow"]


class CellRow(Base):
    __tablename__ = "sched_cells"

    cell_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    node: Mapped[str] = mapped_column(String(128))
    gpus: Mapped[int] = mapped_column(Integer)
    capacity: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(32))
    engine_url: Mapped[str | None] = mapped_column(String(255), nullable=True)
    resident: Mapped[bool] = mapped_column(Boolean)
    ordinal: Mapped[int] = mapped_column(Integer)  # registration order: the growing prefix follows it
    registered_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    role_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    role_since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    switch_from: Mapped[str | None] = mapped_column(String(32), nullable=True)


class GroupRow(Base):
    __tablename__ = "sched_groups"

    group_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)
    version_step: Mapped[int] = mapped_column(Integer)
    size: Mapped[int] = mapped_column(Integer)
    dispatched: Mapped[int] = mapped_column(Integer)
    finished: Mapped[int] = mapped_column(Integer)
    valid: Mapped[int] = mapped_column(Integer)
    last_finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    complete_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True, index=True)  # ready-buffer order
    consumed_step: Mapped[int | None] = mapped_column(Integer, nullable=True)


class VersionRow(Base):
    __tablename__ = "sched_versions"

    weight_version: Mapped[str] = mapped_column(String(64), primary_key=True)
    step: Mapped[int] = mapped_column(Integer)


class StepRow(Base):
    __tablename__ = "sched_steps"

    step: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64))
    weight_version: Mapped[str] = mapped_column(String(64))
    n_samples: Mapped[int] = mapped_column(Integer)  # samples the scheduler saw consumed by this step
    staleness_mean: Mapped[float] = mapped_column(Float)
    staleness_max: Mapped[int] = mapped_column(Integer)
    completed_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    completed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


CELLS: Table = CellRow.__table__  # type: ignore[assignment]
GROUPS: Table = GroupRow.__table__  # type: ignore[assignment]
VERSIONS: Table = VersionRow.__table__  # type: ignore[assignment]
STEPS: Table = StepRow.__table__  # type: ignore[assignment]
