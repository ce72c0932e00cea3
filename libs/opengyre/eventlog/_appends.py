"""Appending events: encoded, headed, large bodies out of band, pipelined on the ack inbox, errors named."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn

from nats.aio.client import Client
from nats.js.api import Header

from ..events import Event, EventRegistry, InvalidEvent
from ._acks import AckError, AckPipeline, PubAck
from ._blobs import BlobStore
from ._config import BLOB_HEADER, TYPE_HEADER, VERSION_HEADER, LogConfig
from ._errors import STORAGE_FULL_CODES, WRONG_LAST_SEQUENCE_CODES, ConcurrencyError, EventLogError, LogUnavailable
from ._stored import Appended

__all__ = ["Appender"]


class Appender:
    """Optimistic appends: dedup by event id (the server's), expected last subject sequence per aggregate."""

    def __init__(
        self,
        nc: Client,
        acks: AckPipeline,
        config: LogConfig,
        registry: EventRegistry,
        blobs: BlobStore,
        unacknowledged: Callable[[str, float], Awaitable[LogUnavailable]],
    ) -> None:
        self._nc = nc
        self._acks = acks
        self._config = config
        self._registry = registry
        self._blobs = blobs
        self._unacknowledged = unacknowledged

    def subject_for(self, event: Event) -> str:
        return self._config.subject(event.aggregate, event.aggregate_id())

    async def _prepare(
        self, event: Event, expected: int | None, body: bytes | None = None
    ) -> tuple[str, bytes, dict[str, str]]:
        subject = self.subject_for(event)
        if body is None:
            body = self._registry.encode(event)
        headers = {
            Header.MSG_ID: event.event_id,
            TYPE_HEADER: event.type_name(),
        }
        if event.version != 1:
            # Absent means v1: every header costs the reader's parser, and most events stay at v1.
            headers[VERSION_HEADER] = str(event.version)
        if expected is not None:
            headers[Header.EXPECTED_LAST_SUBJECT_SEQUENCE] = str(expected)
        limit = min(self._config.inline_limit, self._nc.max_payload - 8 * 1024)
        if len(body) > limit:
            # JetStream caps a message at max_payload (1 MiB by default): the body goes out of band.
            await self._blobs.put(f"event-{event.event_id}", body)
            headers[BLOB_HEADER] = f"event-{event.event_id}"
            body = b""
        return subject, body, headers

    @staticmethod
    def _raise(subject: str, expected: int | None, exc: AckError) -> NoReturn:
        if exc.err_code in WRONG_LAST_SEQUENCE_CODES:
            raise ConcurrencyError(subject, expected if expected is not None else -1, exc.description) from exc
        if exc.err_code in STORAGE_FULL_CODES:
            raise LogUnavailable(f"append to {subject} refused: the log's storage is full ({exc.description})") from exc
        raise EventLogError(f"append to {subject} refused: {exc}") from exc

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Appended:
        """Append one event. Retrying with the same event id stores it once (``duplicate`` is then True).

        ``expected_last_subject_seq`` is the stream sequence of the aggregate's last event (0: none yet);
        a mismatch raises :class:`ConcurrencyError`. An event no store could keep (a NUL character in a
        string) raises ``InvalidEvent`` and is not appended.
        """
        subject, body, headers = await self._prepare(event, expected_last_subject_seq)
        fut = await self._acks.publish(subject, body, headers)
        try:
            ack = await asyncio.wait_for(fut, timeout=10)
        except TimeoutError:
            raise await self._unacknowledged(subject, 10) from None
        except AckError as exc:
            self._raise(subject, expected_last_subject_seq, exc)
            raise  # unreachable: _raise always raises
        return Appended(ack.seq, ack.duplicate)

    async def append_many(self, events: Iterable[Event], *, window: int = 2048) -> list[Appended]:
        """Append events in order with up to ``window`` publishes in flight (no expected-sequence checks).

        Each window is encoded before any of it is published, so an ``InvalidEvent`` appends nothing of
        its window (a call of at most ``window`` events: nothing at all; its note says how many went before).
        """
        out: list[Appended] = []
        it = iter(events)
        while chunk := list(itertools.islice(it, window)):
            try:
                bodies = [self._registry.encode(e) for e in chunk]
            except InvalidEvent as exc:
                exc.add_note(f"{len(out)} events before its window of {len(chunk)} were appended")
                raise
            pending: list[tuple[str, asyncio.Future[PubAck]]] = []
            for event, body in zip(chunk, bodies, strict=True):
                subject, payload, headers = await self._prepare(event, None, body)
                pending.append((subject, await self._acks.publish(subject, payload, headers)))
            for subject, fut in pending:
                try:
                    ack = await asyncio.wait_for(fut, timeout=30)
                except TimeoutError:
                    raise await self._unacknowledged(subject, 30) from None
                except AckError as exc:
                    self._raise(subject, None, exc)
                    raise  # unreachable: _raise always raises
                out.append(Appended(ack.seq, ack.duplicate))
        return out
