"""Encoding, decoding and upcasting of events by type name and schema version."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from ._base import Event
from ._text import ESCAPED_NUL, nul_path

__all__ = [
    "DecodeError",
    "EventRegistry",
    "InvalidEvent",
    "MalformedEvent",
    "NewerSchemaVersion",
    "NulCharacter",
    "UnknownEventType",
    "Upcaster",
    "default_registry",
]

Upcaster = Callable[[dict[str, Any]], dict[str, Any]]


class DecodeError(Exception):
    """An event that cannot be turned into a known Struct; ``reason`` is a short stable code."""

    reason = "undecodable"


class UnknownEventType(DecodeError):
    reason = "unknown-type"


class NewerSchemaVersion(DecodeError):
    reason = "newer-schema"


class MalformedEvent(DecodeError):
    reason = "malformed"


class NulCharacter(MalformedEvent):
    """A text field of the event holds U+0000, which PostgreSQL cannot store (SQLite can): refused on every
    store. Opaque payloads (``Any``) and ``RawText`` fields are not checked (see ``_text``)."""

    reason = "nul-character"


class InvalidEvent(ValueError):
    """An event the log refuses to store (raised at encode, so the producer learns it, not a consumer)."""


def _nul_message(event: Event, path: str) -> str:
    return (
        f"{event.type_name()} field {path} holds a NUL character (\\x00), which a PostgreSQL store cannot keep: "
        "every store refuses it alike"
    )


class _Entry:
    __slots__ = ("cls", "decoder")

    def __init__(self, cls: type[Event]) -> None:
        self.cls = cls
        self.decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(cls)


class EventRegistry:
    """Known event types, one reusable decoder each, and upcasters from old schema versions."""

    def __init__(self, types: Iterable[type[Event]] = ()) -> None:
        self._entries: dict[str, _Entry] = {}
        self._upcasters: dict[tuple[str, int], Upcaster] = {}
        self._encoder = msgspec.json.Encoder()
        self._raw = msgspec.json.Decoder(dict[str, Any])
        for cls in types:
            self.register(cls)

    def register(self, cls: type[Event]) -> type[Event]:
        name = cls.type_name()
        known = self._entries.get(name)
        if known is not None and known.cls is not cls:
            raise ValueError(f"event type {name!r} is already registered by {known.cls.__qualname__}")
        self._entries[name] = _Entry(cls)
        return cls

    def register_upcaster(self, type_name: str, from_version: int, fn: Upcaster) -> None:
        """``fn`` turns the body of ``from_version`` into the body of ``from_version + 1``; it must be pure."""
        self._upcasters[(type_name, from_version)] = fn

    def types(self) -> dict[str, type[Event]]:
        return {name: e.cls for name, e in self._entries.items()}

    def knows(self, type_name: str) -> bool:
        return type_name in self._entries

    def shared_aggregates(self) -> frozenset[str]:
        """The aggregates whose event types have more than one owner (``execution``): their events' subjects carry
        the type as a last token, so NATS can allow each owner its own types only (``runtime.nats_permissions``)."""
        owners: dict[str, set[str]] = {}
        for e in self._entries.values():
            owners.setdefault(e.cls.aggregate, set()).add(e.cls.owner)
        return frozenset(a for a, o in owners.items() if len(o) > 1)

    def encode(self, event: Event) -> bytes:
        """The event's JSON body; raises :class:`InvalidEvent` for one no store could keep (a NUL in a string)."""
        body = self._encoder.encode(event)
        if ESCAPED_NUL in body:
            path = nul_path(event)
            if path is not None:
                raise InvalidEvent(_nul_message(event, path))
        return body

    def decode(self, type_name: str, version: int, body: bytes) -> Event:
        entry = self._entries.get(type_name)
        if entry is None:
            raise UnknownEventType(f"no event type {type_name!r} is known to this service")
        current = entry.cls.version
        if version > current:
            raise NewerSchemaVersion(f"{type_name} v{version} is newer than the v{current} this service knows")
        try:
            if version == current:
                event = entry.decoder.decode(body)
            else:
                raw = self._raw.decode(body)
                for v in range(version, current):
                    fn = self._upcasters.get((type_name, v))
                    if fn is None:
                        raise MalformedEvent(f"no upcaster for {type_name} v{v} -> v{v + 1}")
                    raw = fn(raw)
                raw["type"] = type_name
                event = msgspec.convert(raw, entry.cls)
        except msgspec.DecodeError as exc:
            raise MalformedEvent(f"{type_name} v{version}: {exc}") from exc
        except msgspec.ValidationError as exc:
            raise MalformedEvent(f"{type_name} v{version}: {exc}") from exc
        # The body test is the cheap filter (see ``_text``); an upcaster is code, so its output is walked too.
        if ESCAPED_NUL in body or version != current:
            path = nul_path(event)
            if path is not None:
                raise NulCharacter(f"{type_name} v{version}: {_nul_message(event, path)}")
        return event


def default_registry() -> EventRegistry:
    """A fresh registry holding the whole catalogue."""
    from . import _catalogue

    reg = EventRegistry(
        getattr(_catalogue, name)
        for name in _catalogue.__all__
        if isinstance(getattr(_catalogue, name), type) and issubclass(getattr(_catalogue, name), Event)
    )
    for type_name, from_version, fn in _catalogue.UPCASTERS:
        reg.register_upcaster(type_name, from_version, fn)
    return reg
