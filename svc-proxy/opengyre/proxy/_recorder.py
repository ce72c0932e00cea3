"""Appends model-call events in the order calls finished, off the request path.

A child call's event must follow its parent's in the log (the projection refuses unknown parents), and
the parent's event is queued before its response is sent, so one ordered queue is enough. Batches go out
with ``append_many`` (pipelined publishes); contexts over the inline limit go to the object store first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import msgspec

from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded

__all__ = ["Recorder"]

log = logging.getLogger(__name__)

_enc = msgspec.json.Encoder()


class Recorder:
    def __init__(
        self, event_log: EventLog | None, *, inline_context_limit: int = 64 * 1024, batch: int = 256, retries: int = 5
    ) -> None:
        self.log = event_log
        self.retries = retries
        self.inline_context_limit = inline_context_limit
        self.batch = batch
        self.recorded = 0
        self.failed = 0
        self.blobs = 0
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

    async def _externalise(self, e: ModelCallRecorded) -> ModelCallRecorded:
        assert self.log is not None
        if e.context is None:
            return e
        body = _enc.encode(e.context)
        if len(body) <= self.inline_context_limit:
            return e
        ref = await self.log.put_blob(f"ctx-{e.execution_id}-{e.call_id}", body)
        self.blobs += 1
        return msgspec.structs.replace(e, context=None, context_ref=ref)

    async def _run(self) -> None:
        assert self.log is not None
        while True:
            first = await self._queue.get()
            batch = [first]
            while len(batch) < self.batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            for attempt in range(self.retries + 1):
                try:
                    events = [await self._externalise(e) for e in batch]
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
