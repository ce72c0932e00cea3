"""The event log (NATS JetStream; in memory for tests that fold): dedup, optimistic concurrency, typed reads."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._auth import NatsCredentials
    from ._blobs import BLOB_CORRUPT, BLOB_MISSING, BlobUnreadable

    # the connection class with the measured header-parser override (bench/header_parser_bench.py measures it)
    from ._client import FastHeaderClient
    from ._config import BLOB_HEADER, TYPE_HEADER, VERSION_HEADER, LogConfig
    from ._errors import ConcurrencyError, EventLogError, LogUnavailable, NoQuorum
    from ._health import FULL_MARGIN_BYTES, HealthProbe, LogHealth, StreamUsage, server_health
    from ._log import EventLog
    from ._memory import MemoryEventLog
    from ._payloads import PayloadFetch, PayloadStore, PayloadStoreError
    from ._protocol import EventLogProtocol
    from ._server import MIN_SERVER_VERSION, require_server_version
    from ._stored import TRANSIENT_ERRORS, Appended, StoredEvent, UnreadableBody

_WHERE: dict[str, str] = {
    "NatsCredentials": "_auth",
    "BLOB_CORRUPT": "_blobs",
    "BLOB_MISSING": "_blobs",
    "BlobUnreadable": "_blobs",
    "FastHeaderClient": "_client",
    "BLOB_HEADER": "_config",
    "TYPE_HEADER": "_config",
    "VERSION_HEADER": "_config",
    "LogConfig": "_config",
    "ConcurrencyError": "_errors",
    "EventLogError": "_errors",
    "LogUnavailable": "_errors",
    "NoQuorum": "_errors",
    "FULL_MARGIN_BYTES": "_health",
    "HealthProbe": "_health",
    "LogHealth": "_health",
    "StreamUsage": "_health",
    "server_health": "_health",
    "EventLog": "_log",
    "MemoryEventLog": "_memory",
    "PayloadFetch": "_payloads",
    "PayloadStore": "_payloads",
    "PayloadStoreError": "_payloads",
    "EventLogProtocol": "_protocol",
    "MIN_SERVER_VERSION": "_server",
    "require_server_version": "_server",
    "TRANSIENT_ERRORS": "_stored",
    "Appended": "_stored",
    "StoredEvent": "_stored",
    "UnreadableBody": "_stored",
}

__all__ = [
    "BLOB_CORRUPT",
    "BLOB_HEADER",
    "BLOB_MISSING",
    "FULL_MARGIN_BYTES",
    "MIN_SERVER_VERSION",
    "TRANSIENT_ERRORS",
    "TYPE_HEADER",
    "VERSION_HEADER",
    "Appended",
    "BlobUnreadable",
    "ConcurrencyError",
    "EventLog",
    "EventLogError",
    "EventLogProtocol",
    "FastHeaderClient",
    "HealthProbe",
    "LogConfig",
    "LogHealth",
    "LogUnavailable",
    "MemoryEventLog",
    "NatsCredentials",
    "NoQuorum",
    "PayloadFetch",
    "PayloadStore",
    "PayloadStoreError",
    "StoredEvent",
    "StreamUsage",
    "UnreadableBody",
    "require_server_version",
    "server_health",
]

if TYPE_CHECKING:  # both logs keep the protocol, checked by mypy (the contract test checks what they do)

    def _conforms(nats: EventLog, memory: MemoryEventLog) -> tuple[EventLogProtocol, EventLogProtocol]:
        return nats, memory


# Names load on first use (PEP 562): `opengyre.config` needs only LogConfig; eager, each importer of the
# settings paid for nats-py, aiohttp and httpx (~0.25 CPU-s; bench/import_cost.py).
__getattr__ = lazy_exports(__name__, _WHERE)
