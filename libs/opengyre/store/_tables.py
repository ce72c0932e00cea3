"""Tables of the projection machinery itself: tracking rows and dead letters."""

from __future__ import annotations

from sqlalchemy import LargeBinary, String, Text
from sqlalchemy.orm import Mapped, mapped_column

from ._engine import STREAM_SEQ, Base

__all__ = ["DeadLetter", "TrackedStream", "Tracking"]


class Tracking(Base):
    """One row per (projection, stream sequence) applied; the primary key makes redelivery a no-op."""

    __tablename__ = "og_tracking"

    projection: Mapped[str] = mapped_column(String(64), primary_key=True)
    stream_seq: Mapped[int] = mapped_column(STREAM_SEQ, primary_key=True)


class TrackedStream(Base):
    """The stream a projection's tracking rows count in: a sequence means nothing in another stream.

    A stream deleted and re-created under the same name starts again at 1 with another creation time; the
    runner compares both (and the last event tracked) and refuses to fold a stream that is not this one until
    the projection is rebuilt.
    """

    __tablename__ = "og_tracked_streams"

    projection: Mapped[str] = mapped_column(String(64), primary_key=True)
    stream: Mapped[str] = mapped_column(String(64))
    created: Mapped[str] = mapped_column(String(64))  # the server's creation time of the stream, ISO 8601
    # The last event tracked, by sequence and event id: a store put back to an earlier copy and appended to
    # again holds another event at that sequence (0, "": nothing tracked since the stream was recorded).
    last_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    last_event_id: Mapped[str] = mapped_column(String(64))


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
