"""Typed reads: decoded events of chosen types, over a sequence range (``events``) or live (``subscribe``).

Both skip what this service cannot decode (unknown types, newer schema versions, malformed bodies) with a
warning: a reader must never stop at an event some other service wrote. Projections, which must account
for every event, use the runner instead (it dead-letters those with their reason).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection, Sequence
from typing import TypeVar, overload

from ..events import DecodeError, Event, EventRegistry
from ._config import LogConfig
from ._stored import StoredEvent

__all__ = ["TypeFilter", "TypedReads"]

E = TypeVar("E", bound=Event)

log = logging.getLogger(__name__)


class TypeFilter:
    """Which events a typed read wants: their subjects (by aggregate) and their type names."""

    def __init__(self, config: LogConfig, types: Sequence[type[Event]]) -> None:
        for t in types:
            if not (isinstance(t, type) and issubclass(t, Event)):
                raise TypeError(f"{t!r} is not an event type")
        self.names: Collection[str] = {t.type_name() for t in types}
        self.subjects: list[str] | None = (
            [config.aggregate_filter(a) for a in sorted({t.aggregate for t in types})] if types else None
        )

    def decode(self, decoder: Callable[[StoredEvent], Event], stored: StoredEvent) -> Event | None:
        """The event, if it is one of the wanted types and decodes; None (with a warning) otherwise."""
        if self.names and stored.type_name not in self.names:
            return None
        try:
            return decoder(stored)
        except DecodeError as exc:
            log.warning("event log seq %d (%s) skipped: %s", stored.seq, stored.type_name or "no type", exc)
            return None


class TypedReads:
    """``decode`` and ``events`` over a log's raw ``read``: one piece for the NATS log and the in-memory one."""

    config: LogConfig
    registry: EventRegistry

    def read(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 2048,
    ) -> AsyncIterator[StoredEvent]:
        raise NotImplementedError

    def decode(self, stored: StoredEvent) -> Event:
        """Decode a stored event; raises a ``DecodeError`` subclass with a ``reason`` code."""
        return stored.decode(self.registry)

    @overload
    def events(self, *, start_seq: int = 1, end_seq: int | None = None) -> AsyncGenerator[tuple[int, Event], None]: ...
    @overload
    def events(
        self, *types: type[E], start_seq: int = 1, end_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, E], None]: ...
    async def events(
        self, *types: type[Event], start_seq: int = 1, end_seq: int | None = None
    ) -> AsyncGenerator[tuple[int, Event], None]:
        """``(seq, event)`` of the given types (all when none) in a sequence range, decoded and upcast.

        Only the subjects of those types' aggregates are read. What this service cannot decode is skipped
        with a warning (above).
        """
        want = TypeFilter(self.config, types)
        async for stored in self.read(start_seq, end_seq, subjects=want.subjects):
            event = want.decode(self.decode, stored)
            if event is not None:
                yield stored.seq, event
