"""The domain event log on NATS JetStream: one stream, a subject per aggregate."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Sequence
from typing import TypeVar, overload

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
)
from nats.js.errors import NotFoundError

from ..events import Event, EventRegistry, default_registry
from ..retry import backoff
from ._acks import AckPipeline
from ._appends import Appender
from ._auth import NatsCredentials
from ._blobs import BlobStore
from ._config import LogConfig
from ._connect import open_connection
from ._errors import LogUnavailable
from ._health import ConnectionWatch, HealthProbe, LogHealth, StreamUsage
from ._payloads import PayloadStore
from ._pull import PullBatcher
from ._reads import Reader
from ._retrying import waiting_out_election
from ._stored import TRANSIENT_ERRORS, Appended, StoredEvent, UnreadableBody
from ._stream import StreamAdmin
from ._typed import TypedReads, TypeFilter

__all__ = ["TRANSIENT_ERRORS", "Appended", "EventLog", "StoredEvent", "UnreadableBody"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=Event)


class EventLog(TypedReads):
    """Append and read domain events. Build one per event loop; close it when done."""

    def __init__(
        self,
        nc: Client,
        config: LogConfig,
        registry: EventRegistry,
        *,
        watch: ConnectionWatch | None = None,
        health_url: str | None = None,
    ) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream(timeout=10)
        self.config = config
        self.registry = registry
        self.watch = watch or ConnectionWatch("")
        # nats-server's monitoring URL, when known: it tells a full disk from a slow server.
        self.health_url = health_url
        self._probe = HealthProbe(health_url) if health_url else None
        self._acks = AckPipeline(nc)
        self.admin = StreamAdmin(self.js, config)
        self.blobs = BlobStore(self.js, config.blob_bucket, config.replicas)
        self.reader = Reader(nc, self.js, config, self.admin, self.blobs)
        self.appender = Appender(nc, self._acks, config, registry, self.blobs, self._unacknowledged)
        self.payloads = PayloadStore(nc, self.js, config, self._acks)

    @classmethod
    async def connect(
        cls,
        url: str,
        config: LogConfig | None = None,
        registry: EventRegistry | None = None,
        *,
        timeout: float = 3.0,
        create: bool = True,
        health_url: str | None = None,
        credentials: NatsCredentials | None = None,
        configure: bool = False,
    ) -> EventLog:
        """Connect, check the server's version and JetStream, and make sure the stream exists: ``create``
        creates a missing one with ``config``'s limits, else a missing stream fails. Fails fast, with
        :class:`LogUnavailable`.

        An existing stream's configuration (its limits) is changed only with ``configure``: the stream's one
        owner (``opengyre up``) passes it; every other client takes the stream as it is, so a client with the
        default config does not reset a limit the owner set.

        ``health_url``: the server's HTTP monitoring endpoint, if known (``health`` and append errors use it).
        ``credentials``: who to be to a server that requires them (the embedded one does: ``runtime._natsauth``).
        """
        nc, watch = await open_connection(url, timeout=timeout, credentials=credentials)
        log = cls(nc, config or LogConfig(), registry or default_registry(), watch=watch, health_url=health_url)
        try:
            await log.js.account_info()
        except Exception as exc:
            await nc.close()
            raise LogUnavailable(f"the NATS server at {url} has no JetStream (start it with -js): {exc}") from exc
        await log._acks.start()
        if create or configure:
            try:
                # A cluster that has just elected its meta leader may not answer at once: waited out (10008).
                await waiting_out_election(
                    f"creating stream {log.config.stream}", log.config, lambda: log.ensure_stream(configure=configure)
                )
                if configure:
                    payloads = log.payloads
                    await waiting_out_election(
                        f"creating stream {log.config.payloads}", log.config, lambda: payloads.ensure(configure=True)
                    )
            except nats.js.errors.APIError as exc:
                await log.close()
                # e.g. replicas > 1 on a server that is not clustered, or more replicas than the cluster has
                raise LogUnavailable(
                    f"the NATS server at {url} refuses stream {log.config.stream} "
                    f"({log.config.replicas} replica(s)): {exc.description or exc}"
                ) from exc
        else:
            try:
                await log.js.stream_info(log.config.stream)
            except NotFoundError:
                await log.close()
                raise LogUnavailable(
                    f"the NATS server at {url} has no event stream {log.config.stream!r}: nothing has been logged "
                    "there (`opengyre up` creates it)"
                ) from None
        return log

    async def close(self) -> None:
        self.watch.closing = True
        await self._acks.stop()
        if self._probe is not None:
            await self._probe.aclose()
        with contextlib.suppress(Exception):
            await self.nc.drain()
        with contextlib.suppress(Exception):
            await self.nc.close()

    async def __aenter__(self) -> EventLog:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- stream (StreamAdmin) ---------------------------------------------------------------------

    async def ensure_stream(self, *, configure: bool = False) -> None:
        await self.admin.ensure(configure=configure)

    async def last_seq(self) -> int:
        return await self.admin.last_seq()

    async def usage(self) -> StreamUsage:
        return await self.admin.usage()

    async def first_seq(self) -> int:
        return await self.admin.first_seq()

    # --- health -------------------------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.watch.connected and self.nc.is_connected

    async def health(self, timeout: float = 2.0) -> LogHealth:
        """Whether appends can succeed now: connected, and (with ``health_url``) the server's store healthy."""
        if not self.connected:
            return LogHealth(False, f"the event log at {self.watch.url} is unreachable (reconnecting)")
        if self._probe is not None:
            return await self._probe.check(timeout)
        return LogHealth(True, "")

    async def _unacknowledged(self, subject: str, waited: float) -> LogUnavailable:
        """What a publish that got no acknowledgement means, as far as the client can tell."""
        h = await self.health()
        why = h.reason if not h.ok else "the server is overloaded or cannot store (is its disk full?)"
        return LogUnavailable(f"append to {subject}: no acknowledgement within {waited:.0f} s: {why}")

    # --- append (Appender) ------------------------------------------------------------------------

    def subject_for(self, event: Event) -> str:
        return self.appender.subject_for(event)

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Appended:
        """Append one event. Retrying with the same event id stores it once (``duplicate`` is then True).

        ``expected_last_subject_seq`` is the stream sequence of the aggregate's last event (0: none yet);
        a mismatch raises :class:`ConcurrencyError`. An event no store could keep (a NUL character in a
        string) raises ``InvalidEvent`` and is not appended.
        """
        return await self.appender.append(event, expected_last_subject_seq=expected_last_subject_seq)

    async def append_many(self, events: Iterable[Event], *, window: int = 2048) -> list[Appended]:
        """Append events in order with up to ``window`` publishes in flight (no expected-sequence checks).

        Each window is encoded before any of it is published, so an ``InvalidEvent`` appends nothing of
        its window (a call of at most ``window`` events: nothing at all; its note says how many went before).
        """
        return await self.appender.append_many(events, window=window)

    # --- blobs (BlobStore) -----------------------------------------------------------------------

    async def put_blob(self, name: str, data: bytes) -> str:
        """Store a large payload out of band; events carry the returned reference."""
        return await self.blobs.put(name, data)

    async def get_blob(self, ref: str) -> bytes:
        """A blob's bytes. Raises ``BlobUnreadable`` when it is missing or corrupt (for good); a server that
        does not answer raises nats-py's timeout or no-responders error (worth a retry)."""
        return await self.blobs.read(ref)

    # --- read ---------------------------------------------------------------------------------------

    async def to_stored(self, msg: Msg) -> StoredEvent:
        """The stored event with its body resolved (see ``StoredEvent.unreadable``)."""
        return await self.reader.to_stored(msg)

    async def to_stored_many(self, msgs: Sequence[Msg]) -> list[StoredEvent]:
        return await self.reader.to_stored_many(msgs)

    def to_stored_inline(self, msg: Msg) -> StoredEvent:
        return self.reader.to_stored_inline(msg)

    def read_batches(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 4096,
    ) -> AsyncIterator[list[Msg]]:
        """Raw message batches of an ephemeral, unacknowledged consumer over a sequence range."""
        return self.reader.read_batches(start_seq, end_seq, subjects=subjects, batch=batch)

    def puller(self, consumer: str, *, batch: int = 1024, expires: float = 2.0) -> PullBatcher:
        return self.reader.puller(consumer, batch=batch, expires=expires)

    async def get(self, seq: int) -> StoredEvent:
        return await self.reader.get(seq)

    async def read(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 2048,
    ) -> AsyncIterator[StoredEvent]:
        """Yield stored events with ``start_seq <= seq <= end_seq`` (default: the last one now)."""
        async for msgs in self.read_batches(start_seq, end_seq, subjects=subjects, batch=batch):
            for s in await self.to_stored_many(msgs):
                yield s

    @overload
    def subscribe(
        self, *, start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, Event], None]: ...
    @overload
    def subscribe(
        self, *types: type[E], start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, E], None]: ...
    async def subscribe(
        self, *types: type[Event], start_seq: int | None = None, batch: int = 256
    ) -> AsyncGenerator[tuple[int, Event], None]:
        """Follow the log: ``(seq, event)`` of the given types (all when none) as they are appended, for ever.

        From ``start_seq`` (default: the first event appended after the call). An ephemeral consumer that
        acknowledges nothing; if the server loses it (a restart, a long disconnect), it is re-created after
        the last position delivered, so nothing is skipped or repeated. Close the iterator
        (``contextlib.aclosing``) to delete the consumer at once.
        """
        want = TypeFilter(self.config, types)
        next_seq = start_seq if start_seq is not None else await self.last_seq() + 1
        while True:
            cfg = ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=max(1, next_seq),
                ack_policy=AckPolicy.NONE,
                inactive_threshold=30.0,
                mem_storage=True,
            )
            if want.subjects is None or len(want.subjects) == 1:
                cfg.filter_subject = want.subjects[0] if want.subjects else self.config.all_subjects
            else:
                cfg.filter_subjects = want.subjects
            name = await self._add_consumer_retrying(cfg)
            puller = self.puller(name, batch=batch)
            await puller.start()
            try:
                while True:
                    try:
                        stored_batch = await self.to_stored_many(await puller.next_batch(timeout=1.0))
                    except TRANSIENT_ERRORS as exc:  # a body out of band while the server is away
                        reason = f"{type(exc).__name__}: {exc}"
                        break
                    for stored in stored_batch:
                        next_seq = stored.seq + 1
                        event = want.decode(self.decode, stored)
                        if event is not None:
                            yield stored.seq, event
                    if puller.errors:  # an error status: the consumer is gone, make a new one
                        reason = puller.errors[-1]
                        break
                log.warning("event log subscription: %s; re-subscribing at seq %d", reason, next_seq)
            finally:
                await puller.stop()
                # Bounded: while the server is away a delete would wait out nats-py's 10 s; the consumer's
                # inactivity limit removes it anyway.
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.js.delete_consumer(self.config.stream, name), 2.0)

    async def _add_consumer_retrying(self, cfg: ConsumerConfig) -> str:
        """Create an ephemeral consumer, waiting out a server that is away (capped backoff); its name."""
        async for attempt in backoff(
            "event log subscription: no consumer yet", first_s=0.5, max_s=5.0, retry_on=TRANSIENT_ERRORS, logger=log
        ):
            with attempt:
                # A short timeout: a request made while disconnected is sent on reconnect, and one that timed
                # out may still create a consumer then (its inactivity limit removes it).
                info = await self.js.add_consumer(self.config.stream, cfg, timeout=2.0)
                return str(info.name)
        raise AssertionError("unreachable: the backoff retries for ever")
