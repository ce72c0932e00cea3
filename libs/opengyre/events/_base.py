"""The event base class: a frozen, tagged msgspec Struct carrying the envelope fields."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime
from typing import ClassVar

import msgspec

__all__ = ["Event", "new_event_id", "subject_token", "utcnow"]

_TOKEN = re.compile(r"^[A-Za-z0-9_-]{1,200}$")


def new_event_id() -> str:
    return uuid.uuid4().hex


def utcnow() -> datetime:
    return datetime.now(UTC)


def subject_token(value: str) -> str:
    """An aggregate id as one NATS subject token; ids with dots or wildcards would split or widen subjects."""
    if not _TOKEN.match(value):
        raise ValueError(f"aggregate id {value!r} must match {_TOKEN.pattern} to be used as a subject token")
    return value


class Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Envelope shared by every domain event.

    Subclasses set ``tag`` (never changes), ``version`` (bumped on a breaking change, with an upcaster
    registered for the old one), ``owner`` (the one service that produces it: ``tests/libs/events/
    test_owners.py`` fails when another service's code constructs it), ``aggregate`` (the subject family) and
    ``aggregate_key`` (the field whose value names the aggregate instance).
    """

    version: ClassVar[int] = 1
    owner: ClassVar[str] = ""
    aggregate: ClassVar[str] = ""
    aggregate_key: ClassVar[str] = ""

    event_id: str = msgspec.field(default_factory=new_event_id)
    occurred_at: datetime = msgspec.field(default_factory=utcnow)
    correlation_id: str | None = None
    causation_id: str | None = None

    @classmethod
    def type_name(cls) -> str:
        tag = cls.__struct_config__.tag
        if not isinstance(tag, str):
            raise TypeError(f"{cls.__name__} has no string tag")
        return tag

    def aggregate_id(self) -> str:
        value = getattr(self, self.aggregate_key)
        if not isinstance(value, str):
            raise TypeError(f"{type(self).__name__}.{self.aggregate_key} must be a str")
        return subject_token(value)
