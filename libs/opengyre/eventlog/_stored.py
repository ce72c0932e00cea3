"""What the log stores and answers: a stored event, an append's answer, and the transient errors."""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from ..events import DecodeError, Event, EventRegistry, MalformedEvent
from ._config import VERSION_HEADER

__all__ = ["TRANSIENT_ERRORS", "Appended", "StoredEvent", "UnreadableBody", "ack_position", "bad_version", "version_of"]

# What a server that is restarting or unreachable answers: worth a retry, never a dead letter. A subscription
# waits these out; so does a projection runner resolving an out-of-band body.
TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.ServerError,
)


class Appended(NamedTuple):
    seq: int
    duplicate: bool


class UnreadableBody(DecodeError):
    """The body went out of band and cannot be read back (``reason``: ``blob-missing`` or ``blob-corrupt``)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class StoredEvent(msgspec.Struct, frozen=True):
    """An event as the log holds it: position, routing, type header and the (blob-resolved) body.

    ``unreadable`` is set (a reason code, with ``unreadable_detail``) when the body went out of band and
    that blob is missing or corrupt: the body is then empty and ``decode`` raises :class:`UnreadableBody`.
    """

    seq: int
    subject: str
    type_name: str
    version: int
    event_id: str
    time: datetime | None
    body: bytes
    unreadable: str = ""
    unreadable_detail: str = ""
    bad_version: str | None = None  # an Og-Version header that is not a number, as it came (version is then -1)

    def decode(self, registry: EventRegistry) -> Event:
        """The event; raises a ``DecodeError`` subclass (with a ``reason`` code) when it cannot be had."""
        if self.bad_version is not None:
            raise MalformedEvent(f"{self.type_name}: bad {VERSION_HEADER} header {self.bad_version!r}")
        if self.unreadable:
            raise UnreadableBody(self.unreadable, self.unreadable_detail)
        return registry.decode(self.type_name, self.version, self.body)


def version_of(headers: dict[str, str]) -> int:
    try:
        return int(headers.get(VERSION_HEADER, "1"))
    except ValueError:
        return -1


def bad_version(headers: dict[str, str]) -> str | None:
    """The Og-Version header as it came when it is not a number (else None)."""
    return headers.get(VERSION_HEADER) if version_of(headers) == -1 else None


def ack_position(msg: Msg) -> tuple[int, int]:
    """Stream sequence and timestamp (ns) from a JetStream reply subject, without building nats-py's Metadata.

    ``$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>`` (v1) or the v2 form with
    ``<domain>.<account hash>`` after ``$JS.ACK`` and a trailing token.
    """
    tokens = (msg.reply or "").split(".")
    if len(tokens) == 9:
        return int(tokens[5]), int(tokens[7])
    if len(tokens) >= 11:
        return int(tokens[7]), int(tokens[9])
    meta = msg.metadata  # anything else: let nats-py parse it (and raise on a non-JetStream message)
    return int(meta.sequence.stream), int(meta.timestamp.timestamp() * 1e9) if meta.timestamp else 0
