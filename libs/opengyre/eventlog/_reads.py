"""Reading the log: stored events from messages (bodies resolved), ranges by ephemeral consumer, one by seq."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime

import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy, Header
from nats.js.errors import NotFoundError

from ._blobs import BlobStore
from ._config import BLOB_HEADER, TYPE_HEADER, LogConfig
from ._errors import EventLogError
from ._pull import PullBatcher
from ._retrying import deadline_s, waiting_out_election
from ._stored import StoredEvent, ack_position, bad_version, version_of
from ._stream import StreamAdmin

__all__ = ["Reader"]

log = logging.getLogger(__name__)


class Reader:
    def __init__(
        self, nc: Client, js: JetStreamContext, config: LogConfig, admin: StreamAdmin, blobs: BlobStore
    ) -> None:
        self._nc = nc
        self._js = js
        self._config = config
        self._admin = admin
        self._blobs = blobs

    async def to_stored(self, msg: Msg) -> StoredEvent:
        """The stored event with its body resolved (see ``StoredEvent.unreadable``). A server that does not
        answer while a blob is read raises (transient: retry); a missing or corrupt blob never does."""
        stored = self.to_stored_inline(msg)
        ref = msg.headers.get(BLOB_HEADER) if msg.headers else None
        return await self._blobs.resolve(stored, ref) if ref else stored

    async def to_stored_many(self, msgs: Sequence[Msg]) -> list[StoredEvent]:
        out = [self.to_stored_inline(m) for m in msgs]
        for i, m in enumerate(msgs):
            ref = m.headers.get(BLOB_HEADER) if m.headers else None
            if ref:
                out[i] = await self._blobs.resolve(out[i], ref)
        return out

    def to_stored_inline(self, msg: Msg) -> StoredEvent:
        """The stored event without resolving an out-of-band body (see ``to_stored``)."""
        headers = msg.headers or {}
        seq, ts_ns = ack_position(msg)
        return StoredEvent(
            seq=seq,
            subject=msg.subject,
            type_name=headers.get(TYPE_HEADER, ""),
            version=version_of(headers),
            bad_version=bad_version(headers),
            event_id=headers.get(Header.MSG_ID, ""),
            time=datetime.fromtimestamp(ts_ns / 1e9, UTC),
            body=msg.data,
        )

    async def read_batches(
        self,
        start_seq: int = 1,
        end_seq: int | None = None,
        *,
        subjects: Sequence[str] | None = None,
        batch: int = 4096,
    ) -> AsyncIterator[list[Msg]]:
        """Raw message batches of an ephemeral, unacknowledged consumer over a sequence range."""
        last = await self._admin.last_seq() if end_seq is None else end_seq
        if last < start_seq:
            return
        cfg = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            # Nothing to persist for a read that acknowledges nothing, and it still works on a full disk.
            mem_storage=True,
        )
        filters = list(subjects) if subjects else [self._config.all_subjects]
        if len(filters) == 1:
            cfg.filter_subject = filters[0]
        else:
            cfg.filter_subjects = filters
        stream = self._config.stream
        next_seq = max(1, start_seq)
        loop = asyncio.get_running_loop()
        moved = loop.time()  # when the read last yielded (or began): it gives up once it stalls past the deadline
        while True:
            # A new consumer's own leader may not be elected yet right after a stream leader election: its pulls
            # are answered 503 (or 409, a leadership change). Waited out like any read (``_open`` raises them as no
            # responders).
            info, puller, msgs = await waiting_out_election(
                f"a reader of {stream}", self._config, functools.partial(self._open, cfg, next_seq, batch)
            )
            failed = ""
            try:
                while True:
                    if not msgs:
                        if puller.errors:  # the consumer failed mid-read: read on from the next sequence
                            failed = puller.errors[-1]
                            break
                        # A filtered range may end in a gap: stop once the consumer has nothing pending.
                        try:
                            ci = await waiting_out_election(
                                f"the position of a reader of {stream}",
                                self._config,
                                functools.partial(self._js.consumer_info, stream, info.name, timeout=5.0),
                            )
                        except NotFoundError:  # gone before its pull's error status came: read on as above
                            failed = "the consumer is gone"
                            break
                        if ci.num_pending == 0 or (ci.delivered.stream_seq or 0) >= last:
                            return
                    else:
                        keep = [m for m in msgs if m.metadata.sequence.stream <= last]
                        if keep:
                            next_seq = keep[-1].metadata.sequence.stream + 1
                            moved = loop.time()
                            yield keep
                        if len(keep) < len(msgs) or msgs[-1].metadata.sequence.stream >= last:
                            return
                    msgs = await puller.next_batch(timeout=0.5)
            finally:
                await self._close(info.name, puller)
            if loop.time() - moved > deadline_s(self._config):
                raise EventLogError(f"reading {stream}: no progress past seq {next_seq - 1}: {failed}")
            log.warning("reading %s: %s; reading on at seq %d", stream, failed, next_seq)

    async def _open(self, cfg: ConsumerConfig, seq: int, batch: int) -> tuple[ConsumerInfo, PullBatcher, list[Msg]]:
        """An ephemeral consumer from ``seq``, its puller and its first batch. A first pull answered 503 (the
        consumer's leader not yet elected) raises no responders, for the caller to wait out."""
        cfg.opt_start_seq = seq
        info = await self._js.add_consumer(self._config.stream, cfg, timeout=5.0)
        puller = self.puller(info.name, batch=batch)
        await puller.start()
        try:
            msgs = await puller.next_batch(timeout=0.5)
        except BaseException:
            await self._close(info.name, puller)
            raise
        if not msgs and puller.errors:
            await self._close(info.name, puller)
            if puller.errors[-1].startswith(("503", "409")):  # no leader yet, or a leadership change
                raise nats.errors.NoRespondersError()
            raise EventLogError(f"reading {self._config.stream}: {puller.errors[-1]}")
        return info, puller, msgs

    async def _close(self, consumer: str, puller: PullBatcher) -> None:
        await puller.stop()
        # Bounded: while the server is away a delete would wait out nats-py's 10 s; the consumer's inactivity
        # limit removes it anyway.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._js.delete_consumer(self._config.stream, consumer), 2.0)

    def puller(self, consumer: str, *, batch: int = 1024, expires: float = 2.0) -> PullBatcher:
        return PullBatcher(self._nc, self._config.stream, consumer, batch=batch, expires=expires)

    async def get(self, seq: int) -> StoredEvent:
        raw = await waiting_out_election(
            f"event {seq} of {self._config.stream}", self._config, lambda: self._js.get_msg(self._config.stream, seq)
        )
        headers = dict(raw.headers or {})
        stored = StoredEvent(
            seq=int(raw.seq or seq),
            subject=raw.subject or "",
            type_name=headers.get(TYPE_HEADER, ""),
            version=version_of(headers),
            bad_version=bad_version(headers),
            event_id=headers.get(Header.MSG_ID, ""),
            time=None,
            body=raw.data or b"",
        )
        ref = headers.get(BLOB_HEADER)
        return await self._blobs.resolve(stored, ref) if ref else stored
