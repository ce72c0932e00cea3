"""Appends model-call events in the order calls finished, off the request path.

A child call's event must follow its parent's in the log (the projection refuses unknown parents), and
the parent's event is queued before its response is sent, so one ordered queue is enough. Batches go out
with ``append_many`` (pipelined publishes). Each call's tokens, logprobs and context are stored once, by
digest, in the payload stream first (``opengyre.trajectory.split_payload``); the event carries the reference.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded
from opengyre.trajectory import split_payload

__all__ = ["Recorder"]

log = logging.getLogger(__name__)


class Recorder:
    def __init__(self, event_log: EventLog | None, *, batch: int = 256, retries: int = 5) -> None:
        self.log = event_log
        self.retries = retries
        self.batch = batch
        self.recorded = 0
        self.failed = 0
        self.payload_bytes = 0
        self._queue: asyncio.Queue[ModelCallRecorded] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    def start(self) -> None:
        if self._task is None and self.log is not None:
            self._task = asyncio.create_task(self._run(), name="proxy-recorder")

    async def stop(self) -> None:
        await self.flush()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def record(self, event: ModelCallRecorded) -> None:
        if self.log is None:
            return
        self._idle.clear()
        self._queue.put_nowait(event)

    async def flush(self) -> None:
        """Wait until every queued event is in the log."""
        if self._task is not None:
            await self._idle.wait()

    async def _externalise(self, batch: list[ModelCallRecorded]) -> list[ModelCallRecorded]:
        """Store the batch's payloads (acknowledged before any event refers to them); the events to append."""
        assert self.log is not None
        # Encoding (varints, zlib, SHA-256) off the event loop: the gateway serves requests on it.
        split = await asyncio.to_thread(lambda: [split_payload(e) for e in batch])
        await self.log.payloads.put_many([(e.execution_id, raw) for e, raw in split])
        self.payload_bytes += sum(len(raw) for _, raw in split)
        return [e for e, _ in split]

    async def _run(self) -> None:
        assert self.log is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            while len(batch) < self.batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for attempt in range(self.retries + 1):
                try:
                    events = await self._externalise(batch)
                    # Retrying is safe: the log deduplicates by event id (Nats-Msg-Id).
                    await self.log.append_many(events)
                    self.recorded += len(events)
                    break
                except Exception:
                    if attempt == self.retries:
                        self.failed += len(batch)
                        log.exception("recording %d model calls failed; they are lost", len(batch))
                    else:
                        log.warning("recording %d model calls failed; retrying", len(batch), exc_info=True)
                        await asyncio.sleep(min(5.0, 0.2 * 2**attempt))
            if self._queue.empty():
                self._idle.set()
