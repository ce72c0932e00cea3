"""What a projection is: a named fold of events into view tables."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import ClassVar

from sqlalchemy import Connection, Table

from ..events import Event

__all__ = ["Projection", "Rejected"]


class Rejected(Exception):
    """Raised by ``apply`` for an event the projection refuses (e.g. an unknown execution); dead-lettered."""

    reason = "rejected"


class Projection(ABC):
    """A pure fold ``apply(event, state)`` where the state is the projection's own tables.

    ``apply`` must derive every value it writes from the event and the rows already there (never the clock
    or a random source), so a rebuild from the log gives the same rows byte for byte.
    """

    name: ClassVar[str]
    # Aggregates whose subjects the consumer reads (None: all of them).
    aggregates: ClassVar[Sequence[str] | None] = None
    # Event types folded; others are tracked and skipped (None: all known types).
    event_types: ClassVar[frozenset[str] | None] = None

    @property
    @abstractmethod
    def tables(self) -> Sequence[Table]:
        """The view tables this projection owns, in an order safe for deleting rows (children first)."""

    def handles(self, type_name: str) -> bool:
        return self.event_types is None or type_name in self.event_types

    @abstractmethod
    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        """Fold one event into the view inside the caller's transaction."""

    def apply_batch(self, tx: Connection, events: Sequence[tuple[int, Event]]) -> None:
        """Fold several events in order; override to batch SQL for speed."""
        for seq, event in events:
            self.apply(tx, event, seq)
