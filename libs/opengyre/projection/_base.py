"""What a projection is: a named fold of events into view tables, dispatched by event type."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from sqlalchemy import Connection, Table

from ..events import Event

__all__ = ["Projection", "Rejected", "folds"]

_E = TypeVar("_E", bound=Event)
_P = TypeVar("_P", bound="Projection")
_Handler = Callable[[_P, Connection, _E, int], None]
_MARK = "__opengyre_folds__"


class Rejected(Exception):
    """Raised by ``apply`` for an event the projection refuses (e.g. an unknown execution); dead-lettered with
    ``reason`` (short, stable: what a reader groups by) and the message."""

    reason = "rejected"

    def __init__(self, detail: str = "", *, reason: str | None = None) -> None:
        super().__init__(detail)
        if reason is not None:
            self.reason = reason[:32]


def folds(event_type: type[_E]) -> Callable[[_Handler[_P, _E]], _Handler[_P, _E]]:
    """Mark a projection method as the fold of ``event_type``: ``def _x(self, tx, event, seq) -> None``.

    The class's handlers are its registry: ``apply`` dispatches on the event's type through it and the types
    the consumer folds (``event_types``) are derived from it, so the two can never disagree.
    """

    def mark(fn: _Handler[_P, _E]) -> _Handler[_P, _E]:
        setattr(fn, _MARK, event_type)
        return fn

    return mark


class Projection(ABC):
    """A pure fold ``apply(event, state)`` where the state is the projection's own tables.

    ``apply`` must derive every value it writes from the event and the rows already there (never the clock
    or a random source), so a rebuild from the log gives the same rows byte for byte. Declare one method per
    event type with ``@folds(EventType)``; a projection that folds every type overrides ``apply`` instead.
    """

    name: ClassVar[str]
    # Aggregates whose subjects the consumer reads (None: all of them).
    aggregates: ClassVar[Sequence[str] | None] = None
    # Event types folded, derived from the ``@folds`` handlers; others are tracked and skipped (None: all).
    event_types: ClassVar[frozenset[str] | None] = None
    _folds: ClassVar[Mapping[type[Event], str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        table = dict(cls._folds)  # inherited handlers, overridable
        for attr, value in vars(cls).items():
            event_type = getattr(value, _MARK, None)
            if event_type is not None:
                if event_type in table and table[event_type] != attr and table[event_type] in vars(cls):
                    raise TypeError(f"{cls.__name__}: two folds of {event_type.__name__}")
                table[event_type] = attr
        cls._folds = table
        if table:
            cls.event_types = frozenset(t.type_name() for t in table)

    @property
    @abstractmethod
    def tables(self) -> Sequence[Table]:
        """The view tables this projection owns, in an order safe for deleting rows (children first)."""

    def handles(self, type_name: str) -> bool:
        return self.event_types is None or type_name in self.event_types

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        """Fold one event into the view inside the caller's transaction (through its ``@folds`` handler)."""
        attr = self._folds.get(type(event))
        if attr is not None:
            getattr(self, attr)(tx, event, seq)

    def apply_batch(self, tx: Connection, events: Sequence[tuple[int, Event]]) -> None:
        """Fold several events in order; override to batch SQL for speed."""
        for seq, event in events:
            self.apply(tx, event, seq)
