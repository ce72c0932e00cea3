"""The event log on NATS JetStream: dedup, optimistic concurrency, payload guard, typed reads."""

from ._config import BLOB_HEADER, TYPE_HEADER, VERSION_HEADER, LogConfig
from ._errors import ConcurrencyError, EventLogError, LogUnavailable
from ._log import Appended, EventLog, StoredEvent

__all__ = [
    "BLOB_HEADER",
    "TYPE_HEADER",
    "VERSION_HEADER",
    "Appended",
    "ConcurrencyError",
    "EventLog",
    "EventLogError",
    "LogConfig",
    "LogUnavailable",
    "StoredEvent",
]
