"""What code that appends and reads domain events needs of a log, whichever log it is (NATS or in memory)."""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import Protocol, TypeVar, overload

from ..events import Event, EventRegistry
from ._config import LogConfig
from ._stored import Appended, StoredEvent

__all__ = ["EventLogProtocol"]

E = TypeVar("E", bound=Event)


class EventLogProtocol(Protocol):
    """The event log's semantics, shared by ``EventLog`` (NATS JetStream) and ``MemoryEventLog``.

    One sequence over all subjects (a subject per aggregate); an append with the same event id is stored once;
    ``expected_last_subject_seq`` is the aggregate's last sequence (0: none) or :class:`ConcurrencyError`;
    bodies too large to keep inline read back the same; ``get_blob`` of what was never put raises
    ``BlobUnreadable``. The contract test (``tests/libs/eventlog/test_contract.py``) runs on both.
    """

    config: LogConfig
    registry: EventRegistry

    async def close(self) -> None: ...
    async def last_seq(self) -> int: ...
    async def first_seq(self) -> int: ...
    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Appended: ...
    async def append_many(self, events: Iterable[Event], *, window: int = 2048) -> list[Appended]: ...
    async def put_blob(self, name: str, data: bytes) -> str: ...
    async def get_blob(self, ref: str) -> bytes: ...
    async def get(self, seq: int) -> StoredEvent: ...
    def decode(self, stored: StoredEvent) -> Event: ...
    def read(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 2048,
    ) -> AsyncIterator[StoredEvent]: ...
    @overload
    def events(self, *, start_seq: int = 1, end_seq: int | None = None) -> AsyncGenerator[tuple[int, Event], None]: ...
    @overload
    def events(
        self, *types: type[E], start_seq: int = 1, end_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, E], None]: ...
    @overload
    def subscribe(
        self, *, start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, Event], None]: ...
    @overload
    def subscribe(
        self, *types: type[E], start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, E], None]: ...
