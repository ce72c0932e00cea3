"""Tables of the projection machinery itself: tracking rows and dead letters."""

from __future__ import annotations

from sqlalchemy import LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ._engine import STREAM_SEQ, Base

__all__ = ["DeadLetter", "Tracking"]


class Tracking(Base):
    """One row per (projection, stream sequence) applied; the primary key makes redelivery a no-op."""

    __tablename__ = "og_tracking"

    projection: Mapped[str] = mapped_column(String(64), primary_key=True)
    stream_seq: Mapped[int] = mapped_column(STREAM_SEQ, primary_key=True)


class DeadLetter(Base):
    """An event a projection could not apply, kept with the reason and the raw body."""

    __tablename__ = "og_dead_letters"

    projection: Mapped[str] = mapped_column(String(64), primary_key=True)
    stream_seq: Mapped[int] = mapped_column(STREAM_SEQ, primary_key=True)
    subject: Mapped[str] = mapped_column(String(255))
    event_type: Mapped[str] = mapped_column(String(64))
    event_id: Mapped[str] = mapped_column(String(64))
    reason: Mapped[str] = mapped_column(String(32))
    detail: Mapped[str] = mapped_column(Text)
    payload: Mapped[bytes] = mapped_column(LargeBinary)
