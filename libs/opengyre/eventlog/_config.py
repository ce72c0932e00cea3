"""Where events live: stream, subject prefix, blob bucket."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["LogConfig"]

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_PREFIX = re.compile(r"^[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*$")

# Header names of our own; NATS's own headers (Nats-Msg-Id, ...) come from nats.js.api.Header.
TYPE_HEADER = "Og-Type"
VERSION_HEADER = "Og-Version"
BLOB_HEADER = "Og-Blob"
COMPRESSIONS = ("s2", "none")  # JetStream's StoreCompression values


@dataclass(frozen=True, slots=True)
class LogConfig:
    stream: str = "OPENGYRE"
    prefix: str = "og.ev"
    blob_bucket: str = "OPENGYRE_BLOBS"
    duplicate_window_s: float = 120.0
    replicas: int = 1
    # Bodies larger than this go to the object store; the server's max_payload caps it too.
    inline_limit: int = 512 * 1024
    # Token payloads (docs/storage.md) live in a stream of their own; "" names it after this one.
    payload_stream: str = ""
    # Limits (-1: none). Events are never dropped to make room: a full event stream refuses appends (discard
    # new) and has no age limit. A full payload stream refuses new payloads; its age limit (0: none) deletes
    # payloads whether a step consumed them or not (the trainer then drops such an execution, with the reason).
    max_bytes: int = -1
    payload_max_bytes: int = -1
    payload_max_age_s: float = 0.0
    # How long appends and reads wait out a server or stream leader that is away (0: 10 s on one replica, 30 s on
    # several: a leader election); then an append fails (NoQuorum on a replicated stream).
    retry_deadline_s: float = 0.0
    # How the event and payload streams' file blocks are stored: "s2" (JetStream's Snappy-family block
    # compression, nats-server >= 2.10; applied to a block once it is sealed) or "none". S2 stores a short model
    # call's two messages in 0.38x the bytes once sealed (bench/stream_compression_bench.py); clients see the same.
    compression: str = "s2"

    def __post_init__(self) -> None:
        if not _NAME.match(self.stream):
            raise ValueError(f"stream name {self.stream!r} must match {_NAME.pattern}")
        if self.payload_stream and not _NAME.match(self.payload_stream):
            raise ValueError(f"payload stream name {self.payload_stream!r} must match {_NAME.pattern}")
        for name in ("max_bytes", "payload_max_bytes"):
            value = getattr(self, name)
            if value != -1 and value <= 0:
                raise ValueError(f"{name} must be a positive number of bytes or -1 (no limit), not {value}")
        # JetStream's own bound; a cluster needs at least as many servers (it refuses the stream otherwise).
        if not 1 <= self.replicas <= 5:
            raise ValueError(f"replicas must be 1 to 5 (JetStream's limit), not {self.replicas}")
        if not self.payload_max_age_s >= 0:
            raise ValueError(f"payload_max_age_s must be >= 0 seconds (0: no limit), not {self.payload_max_age_s}")
        if not self.retry_deadline_s >= 0:
            raise ValueError(f"retry_deadline_s must be >= 0 seconds (0: the default), not {self.retry_deadline_s}")
        if self.compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, not {self.compression!r}")
        if not _NAME.match(self.blob_bucket):
            raise ValueError(f"blob bucket {self.blob_bucket!r} must match {_NAME.pattern}")
        if not _PREFIX.match(self.prefix):
            raise ValueError(f"subject prefix {self.prefix!r} must be dot-separated tokens of [A-Za-z0-9_-]")

    @property
    def payloads(self) -> str:
        """The payload stream's name (its subjects are ``<name>.>``)."""
        return self.payload_stream or f"{self.stream}_PAYLOADS"

    @property
    def all_subjects(self) -> str:
        return f"{self.prefix}.>"

    def subject(self, aggregate: str, aggregate_id: str, type_name: str | None = None) -> str:
        """``<prefix>.<aggregate>.<id>``, and ``.<type>`` after it for a shared aggregate's events (their owners'
        publish permissions are per type: ``EventRegistry.shared_aggregates``). Logs written before hold the
        shorter subject for those too; every filter here matches both."""
        base = f"{self.prefix}.{aggregate}.{aggregate_id}"
        return base if type_name is None else f"{base}.{type_name}"

    def aggregate_filter(self, aggregate: str) -> str:
        # ``>``, not ``*``: an aggregate's subjects have one token after it (its id) or two (id and event type).
        return f"{self.prefix}.{aggregate}.>"

    def instance_filters(self, aggregate: str, aggregate_id: str) -> list[str]:
        """The subjects of one aggregate's events, whichever layout wrote them."""
        base = self.subject(aggregate, aggregate_id)
        return [base, f"{base}.*"]
