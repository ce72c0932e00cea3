"""Appending events: encoded, headed, large bodies out of band, pipelined on the ack inbox, errors named."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import NoReturn

import nats.errors
from nats.aio.client import Client
from nats.js.api import Header

from ..events import Event, EventRegistry, InvalidEvent
from ..retry import backoff
from ._acks import AckError, AckPipeline, PubAck
from ._blobs import BlobStore
from ._config import BLOB_HEADER, TYPE_HEADER, VERSION_HEADER, LogConfig
from ._errors import (
    STORAGE_FULL_CODES,
    WRONG_LAST_SEQUENCE_CODES,
    ConcurrencyError,
    EventLogError,
    LogUnavailable,
    NoQuorum,
)
from ._retrying import append_retryable, deadline_s
from ._stored import Appended

__all__ = ["Appender"]

log = logging.getLogger(__name__)

# One attempt's wait for its acknowledgement: long enough for a busy server, short enough that a publish lost with
# a dead leader is sent again soon after the election.
_ATTEMPT_S = 2.0
_EXPECTED_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"


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
        self._shared = registry.shared_aggregates()

    def subject_for(self, event: Event) -> str:
        typed = event.type_name() if event.aggregate in self._shared else None
        return self._config.subject(event.aggregate, event.aggregate_id(), typed)

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
            if event.aggregate in self._shared:
                # The aggregate's last event whatever its type (nats-server 2.11+), not this subject's: optimistic
                # concurrency stays per aggregate. Events under the older, untyped subject are not counted.
                headers[_EXPECTED_SUBJECT] = self._config.subject(event.aggregate, event.aggregate_id()) + ".*"
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

    async def _publish(self, subject: str, body: bytes, headers: dict[str, str], expected: int | None) -> PubAck:
        """Publish until acknowledged, through the project's backoff: a lost leader or server is waited out (up to
        the deadline); a refusal is raised at once as what it means."""
        loop = asyncio.get_running_loop()
        wait = deadline_s(self._config)
        end = loop.time() + wait
        try:
            async for attempt in backoff(
                f"append to {subject}",
                first_s=0.05,
                max_s=1.0,
                retry_if=append_retryable,
                until=lambda: loop.time() >= end,
                logger=log,
            ):
                with attempt:
                    fut = await self._acks.publish(subject, body, headers)
                    return await asyncio.wait_for(fut, timeout=max(0.1, min(_ATTEMPT_S, end - loop.time())))
        except AckError as exc:
            if append_retryable(exc):
                raise await self._gave_up(subject, wait, exc) from exc
            self._raise(subject, expected, exc)
        except (TimeoutError, nats.errors.Error) as exc:
            if append_retryable(exc):
                raise await self._gave_up(subject, wait, exc) from exc
            raise
        raise AssertionError("unreachable: the backoff re-raises its last error")

    async def _gave_up(self, subject: str, waited: float, last: BaseException) -> LogUnavailable:
        if self._config.replicas > 1:
            return NoQuorum(
                f"append to {subject}: no quorum: the stream's {self._config.replicas} replicas had no leader for "
                f"{waited:.0f} s (a majority of the NATS cluster is down?); the append was not stored "
                f"(last: {last!r})"
            )
        return await self._unacknowledged(subject, waited)

    async def append(self, event: Event, *, expected_last_subject_seq: int | None = None) -> Appended:
        """Append one event. Retrying with the same event id stores it once (``duplicate`` is then True).

        ``expected_last_subject_seq`` is the stream sequence of the aggregate's last event (0: none yet);
        a mismatch raises :class:`ConcurrencyError`. An event no store could keep (a NUL character in a
        string) raises ``InvalidEvent`` and is not appended. A server or stream leader that is away is waited
        out (``LogConfig.retry_deadline_s``); an acknowledgement lost with it makes the retry's answer a
        ``duplicate`` of the stored event.
        """
        subject, body, headers = await self._prepare(event, expected_last_subject_seq)
        ack = await self._publish(subject, body, headers, expected_last_subject_seq)
        return Appended(ack.seq, ack.duplicate)

    async def append_many(self, events: Iterable[Event], *, window: int = 2048) -> list[Appended]:
        """Append events in order with up to ``window`` publishes in flight (no expected-sequence checks).

        Each window is encoded before any of it is published, so an ``InvalidEvent`` appends nothing of
        its window (a call of at most ``window`` events: nothing at all; its note says how many went before).
        A publish of the window left unacknowledged (a leader change) is sent again, one by one and in order,
        with the rest of the window: stored once (the event id), in the order sent except across subjects
        where a later publish of the window may have been stored before an earlier one's retry.
        """
        out: list[Appended] = []
        it = iter(events)
        while chunk := list(itertools.islice(it, window)):
            try:
                bodies = [self._registry.encode(e) for e in chunk]
            except InvalidEvent as exc:
                exc.add_note(f"{len(out)} events before its window of {len(chunk)} were appended")
                raise
            pending: list[tuple[str, bytes, dict[str, str], asyncio.Future[PubAck]]] = []
            for event, body in zip(chunk, bodies, strict=True):
                subject, payload, headers = await self._prepare(event, None, body)
                pending.append((subject, payload, headers, await self._acks.publish(subject, payload, headers)))
            pipelined = True
            for subject, payload, headers, fut in pending:
                ack: PubAck | None = None
                if pipelined:
                    try:
                        ack = await asyncio.wait_for(fut, timeout=_ATTEMPT_S)
                    except AckError as exc:
                        if not append_retryable(exc):
                            self._raise(subject, None, exc)
                        pipelined = False
                    except TimeoutError:
                        pipelined = False  # the rest of the window waits on the same lost leader: resend it
                elif fut.done() and not fut.cancelled() and fut.exception() is None:
                    ack = fut.result()
                if ack is None:
                    ack = await self._publish(subject, payload, headers, None)
                out.append(Appended(ack.seq, ack.duplicate))
        return out
