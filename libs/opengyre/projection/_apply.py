"""The transaction that folds a batch of stored events, shared by the live runner, rebuild and replay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from ..eventlog import StoredEvent
from ..events import DecodeError, Event, EventRegistry
from ..store import DeadLetter, TrackedStream, Tracking
from ._base import Projection, Rejected

__all__ = ["BatchOutcome", "FoldTransaction", "StreamRecord", "TransientError", "is_transient"]

_IN_CHUNK = 500  # stay under SQLite's bound-parameter limit


class TransientError(Exception):
    """The store failed in a way worth retrying (locked, disconnected, a concurrent writer)."""


def is_transient(exc: BaseException) -> bool:
    if isinstance(exc, IntegrityError):
        return False
    if isinstance(exc, OperationalError):
        return True
    return isinstance(exc, DBAPIError) and bool(exc.connection_invalidated)


@dataclass(frozen=True)
class StreamRecord:
    """What a projection recorded of the stream it folds (see ``_stream``)."""

    stream: str
    created: str
    last_seq: int
    last_event_id: str


@dataclass
class BatchOutcome:
    applied: int = 0
    skipped: int = 0
    duplicates: int = 0
    dead: dict[int, str] = field(default_factory=dict)  # stream seq -> reason


class FoldTransaction:
    """Fold stored events into one projection; each batch commits view rows and tracking rows together."""

    def __init__(self, projection: Projection, engine: Engine, registry: EventRegistry) -> None:
        self.projection = projection
        self.engine = engine
        self.registry = registry
        self._tables = [Tracking.__table__, DeadLetter.__table__]

    def position(self) -> int:
        with self.engine.connect() as conn:
            value = conn.execute(
                select(func.max(Tracking.stream_seq)).where(Tracking.projection == self.projection.name)
            ).scalar()
        return int(value or 0)

    def counts(self) -> tuple[int, int]:
        """(tracked events, dead letters) of this projection."""
        name = self.projection.name
        with self.engine.connect() as conn:
            tracked = conn.execute(select(func.count()).where(Tracking.projection == name)).scalar()
            dead = conn.execute(select(func.count()).where(DeadLetter.projection == name)).scalar()
        return int(tracked or 0), int(dead or 0)

    def tracked_stream(self) -> StreamRecord | None:
        """The stream the tracking rows count in, with the last event tracked; None before the first bind."""
        t = TrackedStream
        with self.engine.connect() as conn:
            row = conn.execute(
                select(t.stream, t.created, t.last_seq, t.last_event_id).where(t.projection == self.projection.name)
            ).first()
        return None if row is None else StreamRecord(str(row[0]), str(row[1]), int(row[2]), str(row[3]))

    def bind_stream(self, record: StreamRecord) -> None:
        """Record the stream the tracking rows count in (once; a rebuild's ``reset`` clears it)."""
        row = {
            "projection": self.projection.name,
            "stream": record.stream,
            "created": record.created,
            "last_seq": record.last_seq,
            "last_event_id": _text(record.last_event_id)[:64],
        }
        try:
            with self.engine.begin() as tx:
                tx.execute(insert(TrackedStream).values(**row))
        except IntegrityError:
            pass  # another runner of this projection bound it first; the caller checks what is recorded

    def reset(self) -> None:
        """Delete the view rows, tracking rows, dead letters and stream of this projection (for a rebuild)."""
        name = self.projection.name
        with self.engine.begin() as tx:
            for table in self.projection.tables:
                tx.execute(delete(table))
            tx.execute(delete(Tracking).where(Tracking.projection == name))
            tx.execute(delete(DeadLetter).where(DeadLetter.projection == name))
            tx.execute(delete(TrackedStream).where(TrackedStream.projection == name))

    def _done(self, tx: Connection, seqs: Sequence[int]) -> set[int]:
        name = self.projection.name
        top = tx.execute(select(func.max(Tracking.stream_seq)).where(Tracking.projection == name)).scalar()
        # Usual case: everything is past the high-water mark, so nothing in the batch can be a redelivery.
        seqs = [q for q in seqs if top is not None and q <= top]
        done: set[int] = set()
        for i in range(0, len(seqs), _IN_CHUNK):
            chunk = seqs[i : i + _IN_CHUNK]
            done.update(
                tx.execute(
                    select(Tracking.stream_seq).where(Tracking.projection == name, Tracking.stream_seq.in_(chunk))
                ).scalars()
            )
        return done

    def fold(self, batch: Sequence[StoredEvent]) -> BatchOutcome:
        """Apply a batch in one transaction. Raises TransientError when the whole batch should be retried."""
        try:
            with self.engine.begin() as tx:
                return self._fold(tx, batch)
        except (OperationalError, DBAPIError) as exc:
            if is_transient(exc) or isinstance(exc, IntegrityError):
                # IntegrityError on the tracking key: another runner committed these first; retry sees them.
                raise TransientError(str(exc)) from exc
            raise

    def _fold(self, tx: Connection, batch: Sequence[StoredEvent]) -> BatchOutcome:
        out = BatchOutcome()
        name = self.projection.name
        done = self._done(tx, [s.seq for s in batch])
        todo: list[tuple[int, Event]] = []
        dead_rows: list[dict[str, object]] = []
        tracked: list[int] = []
        for s in batch:
            if s.seq in done:
                out.duplicates += 1
                continue
            done.add(s.seq)
            tracked.append(s.seq)
            try:
                if not s.type_name:
                    raise _Missing("the message has no Og-Type header")
                if self.registry.knows(s.type_name) and not self.projection.handles(s.type_name):
                    out.skipped += 1
                    continue
                event = s.decode(self.registry)  # a missing or corrupt blob raises here: "blob-missing", ...
            except (DecodeError, _Missing) as exc:
                dead_rows.append(self._dead(s, getattr(exc, "reason", "malformed"), str(exc)))
                continue
            todo.append((s.seq, event))
        if todo:
            self._apply(tx, batch, todo, dead_rows, out)
        if tracked:
            tx.execute(insert(Tracking), [{"projection": name, "stream_seq": q} for q in tracked])
            top = max(tracked)
            top_id = next(s.event_id for s in batch if s.seq == top)
            tx.execute(
                update(TrackedStream)
                .where(TrackedStream.projection == name, TrackedStream.last_seq < top)
                .values(last_seq=top, last_event_id=_text(top_id)[:64])
            )
        if dead_rows:
            tx.execute(insert(DeadLetter), dead_rows)
            for row in dead_rows:
                out.dead[int(row["stream_seq"])] = str(row["reason"])  # type: ignore[call-overload]
        return out

    def _apply(
        self,
        tx: Connection,
        batch: Sequence[StoredEvent],
        todo: list[tuple[int, Event]],
        dead_rows: list[dict[str, object]],
        out: BatchOutcome,
    ) -> None:
        # Fast path: the whole batch in one savepoint. On a poison event, redo one savepoint per event
        # so the bad one is isolated and the ones behind it still apply.
        try:
            with tx.begin_nested():
                self.projection.apply_batch(tx, todo)
            out.applied += len(todo)
            return
        except Exception as exc:
            if is_transient(exc):
                raise
        by_seq = {s.seq: s for s in batch}
        for seq, event in todo:
            try:
                with tx.begin_nested():
                    self.projection.apply(tx, event, seq)
                out.applied += 1
            except Exception as exc:
                if is_transient(exc):
                    raise
                reason = exc.reason if isinstance(exc, Rejected) else "apply-failed"
                dead_rows.append(self._dead(by_seq[seq], reason, f"{type(exc).__name__}: {exc}"))

    def _dead(self, s: StoredEvent, reason: str, detail: str) -> dict[str, object]:
        return {
            "projection": self.projection.name,
            "stream_seq": s.seq,
            "subject": _text(s.subject)[:255],
            "event_type": _text(s.type_name)[:64],
            "event_id": _text(s.event_id)[:64],
            "reason": reason[:32],
            "detail": _text(detail)[:4000],
            "payload": s.body,
        }


def _text(value: str) -> str:
    """Header values and messages as every store keeps them: PostgreSQL text refuses NUL (SQLite does not)."""
    return value.replace("\x00", "\\x00")


class _Missing(Exception):
    reason = "malformed"
