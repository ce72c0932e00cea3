"""The live projection runner: a durable pull consumer, explicit acks after the SQL commit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import APIError, NotFoundError
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from tenacity import RetryCallState

from ..eventlog import TRANSIENT_ERRORS, EventLog, StoredEvent
from ..retry import backoff
from ._apply import BatchOutcome, FoldTransaction, TransientError, is_transient
from ._base import Projection
from ._stream import StreamMismatch, StreamNow, check_stream

__all__ = ["ProjectionRunner", "ProjectionStatus", "RunnerStopped", "consumer_name"]

log = logging.getLogger(__name__)

T = TypeVar("T")
ACK_TIMEOUT_S = 10.0  # how long the log may take to confirm a batch's ack


def consumer_name(projection: Projection) -> str:
    return f"proj-{projection.name}"


@dataclass(frozen=True)
class ProjectionStatus:
    name: str
    position: int  # highest stream sequence applied
    stream_last_seq: int
    pending: int  # messages the consumer has not yet had acknowledged
    tracked: int
    dead_letters: int
    # Why the projection refuses to fold the log's stream (another stream, or one that ends before its
    # position): it stays where it is until rebuilt. None while it folds.
    error: str | None = None

    @property
    def caught_up(self) -> bool:
        return self.pending == 0 and self.error is None


class RunnerStopped(RuntimeError):
    """The runner ended (stopped, failed, or refuses the stream) before the projection reached the position awaited."""


class ProjectionRunner:
    """Keep one projection up to date with the log. Safe to kill at any point: it resumes exactly."""

    def __init__(
        self,
        projection: Projection,
        log: EventLog,
        engine: Engine,
        *,
        batch: int = 1000,
        retry_delay: float = 0.5,
    ) -> None:
        self.projection = projection
        self.log = log
        self.fold = FoldTransaction(projection, engine, log.registry)
        self.batch = batch
        self.retry_delay = retry_delay
        self.consumer = consumer_name(projection)
        self.applied_total = 0
        self.retries = 0  # batches retried in place after a transient error (store locked, log away)
        self.unacked = 0  # committed batches whose ack the log did not confirm (redelivered, then skipped)
        self.error: str | None = None  # set by ``run`` when it refuses the log's stream (see ``_stream``)
        # The committed position, published after each commit so that a writer awaits its own append being
        # folded (``applied``) instead of polling the tracking rows. -1 until ``run`` has read it from the store.
        self._position = -1
        self._moved = asyncio.Condition()
        # Why the runner does not fold (not started, stopped, failed, refusing the stream); None while it runs.
        self._ended: str | None = "the runner is not running"

    def _filters(self) -> list[str]:
        aggs = self.projection.aggregates
        if not aggs:
            return [self.log.config.all_subjects]
        return [self.log.config.aggregate_filter(a) for a in aggs]

    async def ensure_consumer(self, *, reset: bool = False) -> None:
        """Create the durable consumer at the projection's position + 1 (``reset``: re-create it there).

        The tracking rows, not the consumer, are the truth about what was applied: re-creating the consumer
        on start means messages a killed process held unacknowledged come back at once instead of after
        ``ack_wait``, and the consumer always has today's config (an existing durable is never updated).

        Raises :class:`StreamMismatch` when the log's stream is not the one the tracking rows count in.
        """
        _, why = await check_stream(self.fold, self.log)
        if why is not None:
            raise StreamMismatch(why)
        js, stream = self.log.js, self.log.config.stream
        if reset:
            await self.delete_consumer()
        else:
            try:
                await js.consumer_info(stream, self.consumer)
                return
            except NotFoundError:
                pass
        start = await asyncio.to_thread(self.fold.position) + 1
        filters = self._filters()
        cfg = ConsumerConfig(
            durable_name=self.consumer,
            name=self.consumer,
            # Explicit acks, "all" flavour: acking a batch's last message acknowledges the batch (one ack
            # per commit instead of one per event); poison messages are termed one by one first.
            ack_policy=AckPolicy.ALL,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start,
            ack_wait=30.0,
            max_ack_pending=20_000,
            max_deliver=-1,
        )
        if len(filters) == 1:
            cfg.filter_subject = filters[0]
        else:
            cfg.filter_subjects = filters
        # Right after a delete, nats-server may still be removing the old consumer's files and answer 10012
        # ("meta.inf.tmp: no such file or directory"): retry briefly.
        async for attempt in backoff(
            f"projection {self.projection.name}: creating its consumer",
            first_s=0.05, max_s=2.0, attempts=8, retry_on=APIError, logger=log,
            retry_if=lambda exc: not (isinstance(exc, APIError) and exc.code == 400 and exc.err_code != 10012),
        ):  # fmt: skip
            with attempt:
                await js.add_consumer(stream, cfg)

    async def delete_consumer(self) -> None:
        with contextlib.suppress(NotFoundError):
            await self.log.js.delete_consumer(self.log.config.stream, self.consumer)

    async def _progress(self) -> tuple[StreamNow, str | None, int, int]:
        """(the stream now, why it must not be folded or None, the committed position, messages pending)."""
        now, why = await check_stream(self.fold, self.log, bind=False)
        # The consumer first, the position after it: nothing pending then means everything up to then is committed,
        # so the position read next is at least that (read the other way round, a batch committed and acked between
        # the two reads would leave a position older than "nothing pending" says).
        try:
            info = await self.log.js.consumer_info(self.log.config.stream, self.consumer)
            pending: int | None = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
        except NotFoundError:
            pending = None
        position = await asyncio.to_thread(self.fold.position)
        if pending is None:
            pending = max(0, now.last_seq - position)  # no consumer (being re-created): count conservatively
        return now, why or self.error, position, pending

    async def status(self) -> ProjectionStatus:
        now, why, position, pending = await self._progress()
        tracked, dead = await asyncio.to_thread(self.fold.counts)  # counts every tracking row: status only
        return ProjectionStatus(
            name=self.projection.name,
            position=position,
            stream_last_seq=now.last_seq,
            pending=pending,
            tracked=tracked,
            dead_letters=dead,
            error=why,
        )

    async def wait_caught_up(self, timeout: float = 30.0) -> None:
        """Wait until the consumer has nothing pending (everything published so far is applied). Between two
        looks it waits for the next commit, not a period; each look costs the same whatever the history (the
        status's counts, which scan every tracking row, are not asked for)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        # No consumer creation here: ``run`` owns the consumer (it deletes and re-creates it on start), and a
        # second creator racing that delete can leave nats-server refusing the name (10012) for a while.
        while True:
            _, why, position, pending = await self._progress()
            if why is not None:
                raise StreamMismatch(why)
            if pending == 0:
                # The consumer has nothing pending once the batch is acked, and the runner publishes the
                # position just after that ack: a reader keyed on ``position`` (the scheduler's state cache)
                # must not find the one before. Woken by that publish, not a period.
                await self._published(position, deadline - loop.time())
                return
            left = deadline - loop.time()
            if left <= 0:
                raise TimeoutError(f"projection {self.projection.name} still has {pending} pending")
            # The next commit; or, as the runner may not be folding yet (or its consumer is being re-created),
            # another look after a short while.
            await self._moved_past(position, min(left, 0.5))

    async def _published(self, position: int, timeout: float) -> None:
        """Return once this runner has published ``position`` (committed: read from the store), or at once when it
        is not running (another process folds, or it ended: there is nothing to wait for)."""
        try:
            # The publish follows the ack at once: a deadline spent by the look before still gets a moment.
            await asyncio.wait_for(self.applied(position), max(timeout, 1.0))
        except RunnerStopped:
            return
        except TimeoutError:
            raise TimeoutError(
                f"projection {self.projection.name} committed {position} but published only {self._position}"
            ) from None

    async def _moved_past(self, position: int, timeout: float) -> None:
        """Return once a commit passes ``position``, or after ``timeout``."""
        async with self._moved:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._moved.wait_for(lambda: self._position > position), timeout)

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Fold the log until ``stop``. Refusing the log's stream (see ``_stream``) does not end it: it logs
        the error, reports it in ``status`` and waits for ``stop``, so the service stays up to say why."""
        stop = stop or asyncio.Event()
        self._ended = None
        ended = "the runner stopped"
        try:
            # The store may refuse the start's writes (the stream record) for a while, as a full disk does: wait
            # it out.
            what = "the store cannot record the stream (is its disk full?)"
            if await self._retrying(what, lambda: self._consumer(reset=True), (TransientError,), [], stop):
                await self._publish(await asyncio.to_thread(self.fold.position))
                await self._follow(stop)
            if self.error is not None:
                await self._end(f"the projection refuses to fold: {self.error}")
                await stop.wait()
        except BaseException as exc:
            ended = f"the runner failed: {exc!r}"
            raise
        finally:
            await self._end(ended)

    @property
    def position(self) -> int:
        """The highest stream sequence this runner has seen committed (-1 before ``run`` read it)."""
        return self._position

    async def _publish(self, position: int) -> None:
        if position <= self._position:
            return
        async with self._moved:
            self._position = position
            self._moved.notify_all()

    async def _end(self, why: str) -> None:
        async with self._moved:
            if self._ended is None:
                self._ended = why
            self._moved.notify_all()

    async def applied(self, seq: int) -> None:
        """Return once the projection has committed stream sequence ``seq`` (or beyond).

        Raises :class:`RunnerStopped` when the runner is not running, or ends, before that: a caller never
        waits on a runner that will not move again."""
        async with self._moved:
            await self._moved.wait_for(lambda: self._position >= seq or self._ended is not None)
            if self._position < seq:
                raise RunnerStopped(
                    f"projection {self.projection.name} is at {self._position}, not {seq}: {self._ended}"
                )

    async def positions(self) -> AsyncGenerator[int, None]:
        """Each committed position, from the current one on (positions passed while the consumer was busy are
        skipped: only the latest matters); ends when the runner ends."""
        last = -1

        def moved() -> bool:
            return self._position > last or self._ended is not None

        while True:
            async with self._moved:
                await self._moved.wait_for(moved)
                if self._position <= last:
                    return
                last = self._position
            yield last

    async def _consumer(self, *, reset: bool = False) -> bool:
        try:
            await self.ensure_consumer(reset=reset)
        except DBAPIError as exc:
            if is_transient(exc):  # locked, or full ("database or disk is full"): worth a retry
                raise TransientError(str(exc)) from exc
            raise
        except StreamMismatch as exc:
            self.error = str(exc)
            log.error("projection %s refuses to fold: %s", self.projection.name, exc)
            return False
        return True

    async def _follow(self, stop: asyncio.Event) -> None:
        puller = self.log.puller(self.consumer, batch=self.batch)
        await puller.start()
        try:
            while not stop.is_set():
                msgs = await puller.next_batch(timeout=0.5)
                if msgs:
                    await self.handle(msgs, stop)
                elif puller.errors:
                    err = puller.errors.pop()
                    log.warning("projection %s: pull error %s; re-creating consumer", self.projection.name, err)
                    # The server may be restarting (a crash, a full disk): wait it out rather than end the service.
                    what = "the log does not answer while re-creating the consumer"
                    if not await self._retrying(what, self._consumer, TRANSIENT_ERRORS, [], stop):
                        return
        finally:
            await puller.stop()

    async def _retrying(
        self,
        what: str,
        fn: Callable[[], Awaitable[T]],
        transient: tuple[type[Exception], ...],
        msgs: list[Msg],
        stop: asyncio.Event | None,
    ) -> T | None:
        """``fn()``, retried in place on a transient error: a nak would let later events overtake the batch
        and a fold must see its aggregate's events in order. None when ``stop`` is set meanwhile (nothing
        acknowledged: the next start re-creates the consumer at the position)."""

        async def before_sleep(state: RetryCallState) -> None:
            self.retries += 1
            for m in msgs:
                with contextlib.suppress(Exception):
                    await m.in_progress()  # keep ack_wait from redelivering while we retry

        try:
            async for attempt in backoff(
                f"projection {self.projection.name}: {what}",
                first_s=self.retry_delay, max_s=10.0, retry_on=transient, logger=log, before_sleep=before_sleep,
                until=lambda: stop is not None and stop.is_set(),
            ):  # fmt: skip
                with attempt:
                    return await fn()
        except transient:
            if stop is not None and stop.is_set():
                return None
            raise
        raise AssertionError("unreachable: AsyncRetrying returns or raises")

    async def handle(self, msgs: list[Msg], stop: asyncio.Event | None = None) -> BatchOutcome | None:
        """Fold one batch, then ack it. A transient error (the store locked, the log's object store away
        while an out-of-band body is read) retries the batch in place; a missing or corrupt blob is a
        dead letter like any other poison message."""
        stored: list[StoredEvent] | None = await self._retrying(
            "the log does not answer while reading an out-of-band body",
            lambda: self.log.to_stored_many(msgs),
            TRANSIENT_ERRORS,
            msgs,
            stop,
        )
        if stored is None:
            return None
        batch = stored
        outcome = await self._retrying(
            "transient store error", lambda: asyncio.to_thread(self.fold.fold, batch), (TransientError,), msgs, stop
        )
        if outcome is None:
            return None
        # Ack only after the commit. Poison messages were dead-lettered in that same commit: term them.
        try:
            for m, s in zip(msgs, stored, strict=True):
                if s.seq in outcome.dead:
                    await m.term()
            live = [m for m, s in zip(msgs, stored, strict=True) if s.seq not in outcome.dead]
            if live:
                # A request, not ack + nc.flush(): nats-py's flush that times out leaves its PING's future
                # cancelled, and the late PONG then kills the client's read loop (InvalidStateError) for good.
                await live[-1].ack_sync(timeout=ACK_TIMEOUT_S)
        except TRANSIENT_ERRORS as exc:
            # The server went away between the commit and the ack (the soak saw a service exit on this when
            # nats-server was killed). The batch is committed with its tracking rows: redelivered, it is skipped.
            self.unacked += 1
            log.warning(
                "projection %s: the ack of a committed batch failed (%r); it will be skipped",
                self.projection.name,
                exc,
            )
        self.applied_total += outcome.applied
        # Committed (dead letters too: the tracking rows count them), acked or not: a writer may read it now.
        await self._publish(max(s.seq for s in stored))
        return outcome
