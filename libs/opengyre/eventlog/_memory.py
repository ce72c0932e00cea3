"""The event log in memory: the NATS log's semantics without a server, for tests that only fold events.

Same rules as ``EventLog`` (the contract test runs both): one sequence over all subjects, dedup by event id,
optimistic concurrency by the aggregate's last sequence, subject filters with NATS wildcards, blobs.
Dedup is for the log's lifetime (JetStream's is for its duplicate window: a test never outlives it).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from datetime import UTC, datetime
from typing import TypeVar, overload

import msgspec

from ..events import Event, EventRegistry, default_registry
from ._blobs import BLOB_MISSING, BlobUnreadable
from ._config import LogConfig
from ._errors import ConcurrencyError, EventLogError
from ._stored import Appended, StoredEvent
from ._typed import TypedReads, TypeFilter

__all__ = ["MemoryEventLog", "subject_matches"]

E = TypeVar("E", bound=Event)


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` is one token, a trailing ``>`` one or more."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(want) == len(have)


class MemoryEventLog(TypedReads):
    """Append and read domain events held in this process (one event loop)."""

    def __init__(self, config: LogConfig | None = None, registry: EventRegistry | None = None) -> None:
        self.config = config or LogConfig()
        self.registry = registry or default_registry()
        self._shared = self.registry.shared_aggregates()
        self._events: list[StoredEvent] = []
        self._by_id: dict[str, int] = {}
        self._last_of: dict[str, int] = {}
        self._blobs: dict[str, bytes] = {}
        self._appended = asyncio.Condition()
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    async def __aenter__(self) -> MemoryEventLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def last_seq(self) -> int:
        return len(self._events)

    async def first_seq(self) -> int:
        # JetStream answers 0 for an empty stream, else the first sequence kept (nothing is dropped here).
        return 1 if self._events else 0

    def _check_open(self) -> None:
        if self._closed:
            raise EventLogError("the in-memory event log is closed")

    def _store(self, event: Event, body: bytes, expected: int | None) -> Appended:
        aggregate = self.config.subject(event.aggregate, event.aggregate_id())  # the last sequence is per aggregate
        typed = event.type_name() if event.aggregate in self._shared else None
        subject = self.config.subject(event.aggregate, event.aggregate_id(), typed)
        if (seq := self._by_id.get(event.event_id)) is not None:
            return Appended(seq, True)
        if expected is not None and self._last_of.get(aggregate, 0) != expected:
            raise ConcurrencyError(subject, expected, f"wrong last sequence: {self._last_of.get(aggregate, 0)}")
        seq = len(self._events) + 1
        self._events.append(
            StoredEvent(
                seq=seq,
                subject=subject,
                type_name=event.type_name(),
                version=event.version,
                event_id=event.event_id,
                time=datetime.now(UTC),
                body=body,
            )
        )
        self._by_id[event.event_id] = seq
        self._last_of[aggregate] = seq
        return Appended(seq, False)

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Appended:
        self._check_open()
        appended = self._store(event, self.registry.encode(event), expected_last_subject_seq)
        async with self._appended:
            self._appended.notify_all()
        return appended

    async def append_many(self, events: Iterable[Event], *, window: int = 2048) -> list[Appended]:
        self._check_open()
        chunk = list(events)
        # Encoded before any is stored, as the NATS log does per window: an InvalidEvent appends nothing.
        bodies = [self.registry.encode(e) for e in chunk]
        out = [self._store(e, b, None) for e, b in zip(chunk, bodies, strict=True)]
        async with self._appended:
            self._appended.notify_all()
        return out

    async def put_blob(self, name: str, data: bytes) -> str:
        self._blobs[name] = bytes(data)
        return name

    async def get_blob(self, ref: str) -> bytes:
        try:
            return self._blobs[ref]
        except KeyError:
            raise BlobUnreadable(BLOB_MISSING, ref, "no such object in the in-memory log") from None

    async def get(self, seq: int) -> StoredEvent:
        if not 1 <= seq <= len(self._events):
            raise EventLogError(f"no message with sequence {seq}")
        # As JetStream's direct get: no server timestamp.
        return msgspec.structs.replace(self._events[seq - 1], time=None)

    def _range(self, start_seq: int, end_seq: int, subjects: Sequence[str] | None) -> list[StoredEvent]:
        filters = list(subjects) if subjects else [self.config.all_subjects]
        return [
            s
            for s in self._events[max(1, start_seq) - 1 : end_seq]
            if any(subject_matches(f, s.subject) for f in filters)
        ]

    async def read(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 2048,
    ) -> AsyncIterator[StoredEvent]:
        last = len(self._events) if end_seq is None else end_seq
        for stored in self._range(start_seq, last, subjects):
            yield stored

    @overload
    def subscribe(
        self, *, start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, Event], None]: ...
    @overload
    def subscribe(
        self, *types: type[E], start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, E], None]: ...
    async def subscribe(
        self, *types: type[Event], start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, Event], None]:
        want = TypeFilter(self.config, types)
        next_seq = start_seq if start_seq is not None else len(self._events) + 1
        while True:
            async with self._appended:
                while len(self._events) < next_seq:
                    await self._appended.wait()
            end = len(self._events)
            for stored in self._range(next_seq, end, want.subjects):
                event = want.decode(self.decode, stored)
                if event is not None:
                    yield stored.seq, event
            next_seq = end + 1
