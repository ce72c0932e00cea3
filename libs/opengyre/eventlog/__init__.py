"""The event log on NATS JetStream: dedup, optimistic concurrency, payload guard, typed reads."""

from ._blobs import BLOB_CORRUPT, BLOB_MISSING, BlobUnreadable
from ._config import BLOB_HEADER, TYPE_HEADER, VERSION_HEADER, LogConfig
from ._errors import ConcurrencyError, EventLogError, LogUnavailable
from ._log import TRANSIENT_ERRORS, Appended, EventLog, StoredEvent, UnreadableBody

__all__ = [
    "BLOB_CORRUPT",
    "BLOB_HEADER",
    "BLOB_MISSING",
    "TRANSIENT_ERRORS",
    "TYPE_HEADER",
    "VERSION_HEADER",
    "Appended",
    "BlobUnreadable",
    "ConcurrencyError",
    "EventLog",
    "EventLogError",
    "LogConfig",
    "LogUnavailable",
    "StoredEvent",
    "UnreadableBody",
]
