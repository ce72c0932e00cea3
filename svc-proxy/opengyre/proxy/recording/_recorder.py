"""Records every answered model call in the log exactly once: a durable outbox, drained in order.

``record`` commits the call's event to the outbox (``_outbox``: SQLite) and gives what to wait for until it is
fsync'd; the gateway sends a call's last bytes only after that. A background drainer hands the outbox to the log in the
order the events were put and removes each batch once the log acknowledged it. While the log is away the
drainer retries for ever (capped, jittered backoff) and the outbox grows up to its bound; past the bound the
gateway refuses new calls (503/529 with Retry-After) instead of answering calls it could not record.

Exactly once: an event goes out with its event id as ``Nats-Msg-Id``, so JetStream drops a repeat within its
duplicate window; and whenever the fate of a batch is unknown (a failed publish, or rows a previous process left
behind) the drainer first reads the log after ``confirmed_seq`` and removes the rows it finds there, so a repeat
after the window is never sent.

Order: a child call's event must follow its parent's (the projection refuses unknown parents). A call is put
after its parent's put returned, so the outbox is in order; a batch never holds a call together with its parent
(the batch ends before such a call), so whatever part of a failed batch reached the log, no child is there
without its parent. Each call's tokens, logprobs and context are
stored once, by digest, in the payload stream first (``opengyre.trajectory.split_payload``); the event carries
the reference.

Sealing (``seal`` then ``sealed_calls``): when a rollout ends, its execution is sealed (durably: no call of it is put
after) and its rows are flushed; then the log holds every call of the execution, and their number goes into the
execution's ``execution-finished``, so the trainer waits for exactly those calls instead of racing the outbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from nats.js.api import Header
from prometheus_client.core import CounterMetricFamily, Metric
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from opengyre.eventlog import EventLog, LogUnavailable
from opengyre.events import InvalidEvent, ModelCallRecorded
from opengyre.trajectory import split_payload

from .._metrics import counter, gauge
from ._outbox import QUARANTINE_REASONS, ExecutionSealed, Outbox, RecordFailed

if TYPE_CHECKING:
    from ._store import SealedFinishes

__all__ = ["ExecutionSealed", "RecordFailed", "Recorder", "RecorderFull", "SealUnavailable"]

log = logging.getLogger(__name__)

# A batch of up to this many tokens is encoded on the event loop (~0.3 ms at most): the hop to a thread cost ~45 us
# of CPU on its own (more than encoding a short call) and its encoding holds the GIL anyway; a batch with long
# prompts (numpy, zlib and SHA-256 release the GIL on large buffers) still goes to a thread.
_INLINE_TOKENS = 2048


class RecorderFull(Exception):
    """The outbox holds as many events as it may: new calls are refused until the log takes them."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class SealUnavailable(Exception):
    """The proxy records nothing (no event log): there is no recorded count to seal."""


class Recorder:
    def __init__(
        self,
        event_log: EventLog | None,
        *,
        outbox_path: Path | None = None,
        outbox_fsync: bool = True,
        batch: int = 256,
        max_events: int = 100_000,
        max_bytes: int = 2 << 30,
        retry_after_s: float = 5.0,
        max_backoff_s: float = 2.0,
        publish_timeout_s: float = 10.0,
        sealed: SealedFinishes | None = None,
        secret: bytes | None = None,
    ) -> None:
        """``sealed``: the executions whose sealed finish the log holds (the proxy's store), what lets the outbox
        forget their seals (``prune_sealed``) and refuse rows of them. ``secret``: the proxy's, which the
        outbox's row tags are derived from (None: ``Outbox``'s default)."""
        self.log = event_log
        self.sealed = sealed
        self.batch = batch
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.retry_after_s = retry_after_s
        self.max_backoff_s = max_backoff_s
        self.publish_timeout_s = publish_timeout_s  # a batch whose acknowledgements do not come is sent again
        self.outbox = Outbox(
            outbox_path,
            fsync=outbox_fsync,
            sealed_in_log=sealed.count if sealed is not None else None,
            secret=secret,
        )
        self.recorded = 0  # events the log acknowledged
        self.invalid = 0  # calls whose event no store could keep (answered with an error)
        self.refused = 0  # calls refused because the outbox was full
        self.send_failures = 0  # drain attempts that failed (the log away, a timeout)
        self.found_in_log = 0  # outbox rows the log already held (a publish whose acknowledgement was lost)
        self.payload_bytes = 0  # encoded token payload bytes stored
        self._unsure = False  # some rows may be in the log already: look before sending them
        self._task: asyncio.Task[None] | None = None

    @property
    def failed(self) -> int:
        """Calls answered with an error because their event could not be made durable."""
        return self.invalid + self.outbox.failed

    @property
    def pending(self) -> int:
        """Events answered and not yet acknowledged by the log."""
        return self.outbox.pending

    def metrics(self) -> Iterator[Metric]:
        """The recorder's figures for ``/metrics``: events recorded, failed and refused, the outbox's backlog."""
        yield counter("opengyre_proxy_recorded_total", "Model-call events appended to the log.", self.recorded)
        yield counter(
            "opengyre_proxy_record_failed_total",
            "Calls answered with an error because their event could not be written to the outbox.",
            self.failed,
        )
        yield gauge(
            "opengyre_proxy_outbox_events", "Answered calls whose events wait in the outbox for the log.", self.pending
        )
        yield gauge("opengyre_proxy_outbox_bytes", "Bytes of those events.", self.outbox.pending_bytes)
        yield counter(
            "opengyre_proxy_outbox_refused_total", "Calls refused (503/529) because the outbox was full.", self.refused
        )
        yield counter(
            "opengyre_proxy_record_send_failures_total",
            "Attempts to hand the outbox to the log that failed (each is retried).",
            self.send_failures,
        )
        quarantined = CounterMetricFamily(
            "opengyre_proxy_outbox_quarantined",
            "Outbox rows set aside instead of published (not the proxy's: no or a bad integrity tag, an execution it"
            " never recorded or sealed; or undecodable), by reason, since this process started.",
            labels=["reason"],
        )
        for reason in QUARANTINE_REASONS:
            quarantined.add_metric([reason], self.outbox.quarantined[reason])
        yield quarantined
        if self.outbox.is_open:
            yield gauge(
                "opengyre_proxy_outbox_quarantine_rows",
                "Rows in the outbox file's quarantine (every run of it): kept for an operator, never published.",
                self.outbox.quarantine_rows(),
            )
        yield counter(
            "opengyre_proxy_payload_bytes_total",
            "Encoded token payload bytes stored (tokens, logprobs, context).",
            self.payload_bytes,
        )

    @property
    def durable(self) -> bool:
        return self.outbox.path is not None

    async def start(self) -> None:
        if self.log is None or self._task is not None:
            return
        await self.outbox.open()
        self._unsure = self.outbox.left_by_previous > 0
        self._task = asyncio.create_task(self._run(), name="proxy-recorder")

    async def stop(self, timeout: float = 30.0) -> None:
        """Hand what the log will take within ``timeout`` to it; a durable outbox keeps the rest for next time."""
        if self._task is None:
            return
        try:
            await asyncio.wait_for(self.flush(), timeout)
        except TimeoutError:
            if self.durable:
                log.warning(
                    "%d model-call events stay in the outbox %s until the next start", self.pending, self.outbox.path
                )
            else:
                log.error(
                    "%d model-call events were not recorded: the log was away and the outbox is in memory", self.pending
                )
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._task = None
        await self.outbox.close()

    def admit(self) -> None:
        """Raise RecorderFull when a new call could not be recorded without exceeding the outbox's bound."""
        if self.log is None:
            return
        ob = self.outbox
        if ob.pending >= self.max_events or ob.pending_bytes >= self.max_bytes:
            self.refused += 1
            raise RecorderFull(
                f"the event log has not taken the last {ob.pending} recorded calls ({ob.pending_bytes} bytes) yet;"
                " new calls are refused until it does",
                self.retry_after_s,
            )

    def check_open(self, execution_id: str) -> None:
        """Raise ExecutionSealed if the execution takes no more calls (checked again when the call is recorded)."""
        if self._task is not None and self.outbox.sealed(execution_id):
            raise ExecutionSealed(execution_id)

    async def seal(self, execution_id: str) -> None:
        """Refuse the execution's calls from now on; durable when this returns (a restart keeps refusing them)."""
        if self._task is None:
            raise SealUnavailable("the proxy records no calls (no event log), so it cannot seal an execution")
        await self.outbox.seal(execution_id)

    async def sealed_calls(self, execution_id: str) -> int:
        """After ``seal``: wait until the log holds the execution's calls; how many it recorded (every run)."""
        if self._task is None:
            raise SealUnavailable("the proxy records no calls (no event log), so it cannot seal an execution")
        await self.outbox.wait_flushed(execution_id)
        return self.outbox.calls(execution_id)

    async def prune_sealed(self) -> int:
        """Forget the outbox's seals of executions whose sealed finish the log holds (the store answers for them
        from now on); how many. The outbox then holds only executions in progress."""
        if self.sealed is None or self._task is None:
            return 0
        ids = self.outbox.sealed_ids()
        if not ids:
            return 0
        in_log = await asyncio.to_thread(self.sealed.which, ids)
        return self.outbox.prune(in_log)

    def record(self, event: ModelCallRecorded) -> asyncio.Future[None] | None:
        """Commit ``event`` to the outbox. None: it is durable already (in memory, or without fsync); else a
        future that completes once it is (fsync'd). RecordFailed, raised or from the future, otherwise."""
        if self.log is None:
            return None
        try:
            return self.outbox.put(event)
        except InvalidEvent as exc:  # an event no store could keep (a NUL in a text field)
            self.invalid += 1
            raise RecordFailed(str(exc)) from exc

    async def flush(self) -> None:
        """Wait until every recorded event is in the log."""
        if self._task is not None:
            await self.outbox.wait_empty()

    # --- the drainer ------------------------------------------------------------------------------------

    async def _externalise(self, batch: list[ModelCallRecorded]) -> list[ModelCallRecorded]:
        """Store the batch's payloads (acknowledged before any event refers to them); the events to append."""
        assert self.log is not None
        tokens = sum(len(e.prompt_delta_ids) + len(e.output_ids) for e in batch)
        if tokens <= _INLINE_TOKENS:
            split = [split_payload(e) for e in batch]
        else:
            # Encoding (varints, zlib, SHA-256) off the event loop: the gateway serves requests on it.
            split = await asyncio.to_thread(lambda: [split_payload(e) for e in batch])
        await self.log.payloads.put_many([(e.execution_id, raw) for e, raw in split])
        self.payload_bytes += sum(len(raw) for _, raw in split)
        return [e for e, _ in split]

    def _log_retry(self, state: RetryCallState) -> None:
        self.send_failures += 1
        exc = state.outcome.exception() if state.outcome is not None else None
        log.warning(
            "recording: the log did not take %d model-call events (%s); retrying", self.pending, exc, exc_info=False
        )

    async def _run(self) -> None:
        while True:
            await self.outbox.wait_rows()
            # Once more round the loop: the calls woken with the drainer send their answers before it works.
            await asyncio.sleep(0)
            async for attempt in AsyncRetrying(
                retry=retry_if_exception_type(Exception),
                wait=wait_exponential_jitter(multiplier=0.1, max=self.max_backoff_s, jitter=0.1),
                before_sleep=self._log_retry,
            ):
                with attempt:
                    await self._send_next()

    async def _send_next(self) -> None:
        assert self.log is not None
        if not self.log.nc.is_connected:
            raise LogUnavailable("not connected to NATS")  # publishing now would only fill nats-py's buffer
        try:
            if self._unsure:
                await self._reconcile()
                self._unsure = False
            await self._send_batch()
        except BaseException:
            self._unsure = True  # any part of the batch may have reached the log
            raise

    async def _send_batch(self) -> None:
        assert self.log is not None
        rows = await self.outbox.head(self.batch)
        batch: list[tuple[int, ModelCallRecorded]] = []
        calls: set[tuple[str, str]] = set()
        for row_id, e in rows:
            if e.parent_call_id is not None and (e.execution_id, e.parent_call_id) in calls:
                break  # the child goes in the next batch, once its parent is acknowledged
            batch.append((row_id, e))
            calls.add((e.execution_id, e.call_id))
        if not batch:
            return
        if self.outbox.confirmed_seq is None:
            # Before this outbox's first publish: where to start looking if a publish's fate is ever unknown.
            await self.outbox.set_confirmed(await self.log.last_seq())
        async with asyncio.timeout(self.publish_timeout_s):
            events = await self._externalise([e for _, e in batch])
            acks = await self.log.append_many(events)
        await self.outbox.remove([i for i, _ in batch], max(a.seq for a in acks))
        self.recorded += len(batch)

    async def _reconcile(self) -> None:
        """Remove the rows the log already holds (read after ``confirmed_seq``, this outbox's known position)."""
        assert self.log is not None
        last = await self.log.last_seq()
        since = self.outbox.confirmed_seq
        if since is None:  # set durably before this outbox's first publish: nothing of it was ever sent
            await self.outbox.set_confirmed(last)
            return
        start = since + 1 if since <= last else 1  # a stream that is not the one we marked: read all of it
        seen: list[str] = []
        if start <= last:
            subjects = [self.log.config.aggregate_filter(ModelCallRecorded.aggregate)]
            async for msgs in self.log.read_batches(start, last, subjects=subjects):
                seen += [m.headers[Header.MSG_ID] for m in msgs if m.headers and Header.MSG_ID in m.headers]
        present = await self.outbox.rows_with_event_ids(seen)
        await self.outbox.remove(present, last)
        if present:
            self.found_in_log += len(present)
            self.recorded += len(present)
            log.info("recording: %d outbox events were in the log already (not sent again)", len(present))
