"""Payloads stored once, by content digest, in a JetStream stream of their own.

Subjects: ``<stream>.<scope>.<digest>`` (scope: the aggregate id, an execution), one message per payload;
one larger than a message may be is split into parts ``<digest>``, ``<digest>.1``, ... with the count in the
first part's ``Og-Parts`` header. Why a stream and not the object store: one message per payload (the object
store writes a chunk and a meta message), pipelined puts on the log's ack pipeline, and reads of all of a
scope's payloads in one batched direct get (the object store's ``get`` creates a consumer per object). A
scope's payloads are deleted with one subject purge (retention compacts an execution at a time).

Puts are idempotent: each part is published with ``Nats-Expected-Last-Subject-Sequence: 0``, so the same
content put twice is stored once (the second put is answered "wrong last sequence", which means: already there).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, Header, StorageType, StoreCompression, StreamConfig
from nats.js.errors import NotFoundError

from ._acks import AckError, AckPipeline, PubAck
from ._config import LogConfig
from ._errors import WRONG_LAST_SEQUENCE_CODES, EventLogError
from ._stream import compression_of

__all__ = ["PARTS_HEADER", "PayloadFetch", "PayloadStore", "PayloadStoreError"]

PARTS_HEADER = "Og-Parts"
# JetStream: 10054 "maximum messages exceeded", 10047 "insufficient resources", 10077 "maximum bytes exceeded"
# ... the server words this differently across versions, so the description is kept in the error.
_GET_CONCURRENCY = 16
_BATCH = 100_000  # messages one batched read may return (an execution's payloads and their parts)


class PayloadStoreError(EventLogError):
    """A payload could not be stored (a full payload stream, a server error): the call's event is not appended."""


@dataclass
class PayloadFetch:
    """What a batch read found: the payloads by key, and the keys it could not give with why."""

    found: dict[tuple[str, str], bytes] = field(default_factory=dict)
    failed: dict[tuple[str, str], str] = field(default_factory=dict)  # key -> "payload-missing" | "payload-corrupt"


class PayloadStore:
    """Payloads by digest; shares the log's connection and ack pipeline, handed in (it holds no log)."""

    def __init__(self, nc: Client, js: JetStreamContext, config: LogConfig, acks: AckPipeline) -> None:
        self._nc = nc
        self._js = js
        self._config = config
        self._acks = acks
        self._ready = False

    @property
    def stream(self) -> str:
        return self._config.payloads

    def subject(self, scope: str, digest: str, part: int = 0) -> str:
        base = f"{self.stream}.{scope}.{digest}"
        return base if part == 0 else f"{base}.{part}"

    def _stream_config(self) -> StreamConfig:
        cfg = self._config
        return StreamConfig(
            name=self.stream,
            subjects=[f"{self.stream}.>"],
            storage=StorageType.FILE,
            num_replicas=cfg.replicas,
            allow_direct=True,
            # Never drop a payload to make room: a full stream refuses new ones (the recorder retries).
            discard=DiscardPolicy.NEW,
            max_bytes=cfg.payload_max_bytes,
            max_age=cfg.payload_max_age_s,
            max_msg_size=-1,
            compression=StoreCompression(cfg.compression),
        )

    async def ensure(self, *, configure: bool = False) -> None:
        """Create the payload stream if it is missing; with ``configure`` (its owner, ``opengyre up``, only)
        also bring an existing one's limits to the configured ones. Any other client takes it as it is."""
        if self._ready and not configure:
            return
        want = self._stream_config()
        try:
            info = await self._js.stream_info(self.stream)
        except NotFoundError:
            await self._js.add_stream(want)
        else:
            have = info.config
            fields = ("max_bytes", "max_age", "discard", "allow_direct", "compression")
            now = (have.max_bytes, have.max_age or 0.0, have.discard, have.allow_direct, compression_of(have))
            if configure and now != tuple(getattr(want, f) for f in fields):
                for f in fields:
                    setattr(have, f, getattr(want, f))
                await self._js.update_stream(have)
        self._ready = True

    def _part_size(self) -> int:
        return max(1024, self._nc.max_payload - 8 * 1024)

    async def put_many(self, items: Sequence[tuple[str, bytes]]) -> list[str]:
        """Store ``(scope, data)`` payloads (pipelined); their digests, in order. Raises PayloadStoreError."""
        await self.ensure()
        size = self._part_size()
        pending: list[tuple[str, asyncio.Future[PubAck]]] = []
        digests: list[str] = []
        for scope, data in items:
            digest = hashlib.sha256(data).hexdigest()
            digests.append(digest)
            parts = [data[i : i + size] for i in range(0, len(data), size)] or [b""]
            for i, part in enumerate(parts):
                headers: dict[str, str] = {Header.EXPECTED_LAST_SUBJECT_SEQUENCE: "0"}
                if i == 0 and len(parts) > 1:
                    headers[PARTS_HEADER] = str(len(parts))
                subject = self.subject(scope, digest, i)
                pending.append((subject, await self._acks.publish(subject, part, headers)))
        for subject, fut in pending:
            try:
                await asyncio.wait_for(fut, timeout=30)
            except AckError as exc:
                if exc.err_code in WRONG_LAST_SEQUENCE_CODES:
                    continue  # already stored: content-addressed, so it is the same bytes
                raise PayloadStoreError(f"storing payload {subject} refused: {exc.description or exc}") from exc
            except TimeoutError as exc:
                raise PayloadStoreError(f"storing payload {subject}: no acknowledgement") from exc
        return digests

    async def put(self, scope: str, data: bytes) -> str:
        return (await self.put_many([(scope, data)]))[0]

    async def _get_part(self, subject: str) -> tuple[bytes, int] | None:
        try:
            raw = await self._js.get_msg(self.stream, subject=subject, direct=True)
        except NotFoundError:
            return None
        headers = raw.headers or {}
        return bytes(raw.data or b""), int(headers.get(PARTS_HEADER, "1"))

    async def get(self, scope: str, digest: str) -> bytes | None:
        """The payload, or None when it is not stored (never put, compacted, or aged out).

        Raises PayloadStoreError when the stored bytes do not have the digest they are stored under."""
        first = await self._get_part(self.subject(scope, digest))
        if first is None:
            return None
        data, n = first
        if n > 1:
            rest = await asyncio.gather(*(self._get_part(self.subject(scope, digest, i)) for i in range(1, n)))
            if any(r is None for r in rest):
                return None
            data += b"".join(r[0] for r in rest if r is not None)
        if hashlib.sha256(data).hexdigest() != digest:
            raise PayloadStoreError(f"payload {scope}/{digest} is corrupt: its content has another digest")
        return data

    async def get_many(self, keys: Sequence[tuple[str, str]], *, concurrency: int = _GET_CONCURRENCY) -> PayloadFetch:
        """Read ``(scope, digest)`` payloads: one batched direct get per scope (every payload of an execution in
        one request), up to ``concurrency`` scopes at a time; one get per payload where a batch falls short."""
        out = PayloadFetch()
        if not keys:
            return out
        await self.ensure()
        by_scope: dict[str, list[str]] = {}
        for scope, digest in dict.fromkeys(keys):
            by_scope.setdefault(scope, []).append(digest)
        sem = asyncio.Semaphore(concurrency)

        def settle(key: tuple[str, str], data: bytes | None) -> None:
            if data is None:
                out.failed[key] = "payload-missing"
            elif hashlib.sha256(data).hexdigest() != key[1]:
                out.failed[key] = "payload-corrupt"
            else:
                out.found[key] = data

        async def one(key: tuple[str, str]) -> None:
            async with sem:
                try:
                    settle(key, await self.get(*key))
                except PayloadStoreError:
                    out.failed[key] = "payload-corrupt"

        async def scope_of(scope: str, digests: list[str]) -> None:
            async with sem:
                msgs = await self._get_scope(scope)
            if msgs is None:  # the server could not give them in one batch: one by one
                await asyncio.gather(*(one((scope, d)) for d in digests))
                return
            for d in digests:
                settle((scope, d), _assemble(msgs, self.subject(scope, d)))

        await asyncio.gather(*(scope_of(scope, digests) for scope, digests in by_scope.items()))
        return out

    async def _get_scope(self, scope: str) -> dict[str, tuple[bytes, int]] | None:
        """Every payload message of a scope, by subject, from one batched direct get (``multi_last`` over
        ``<stream>.<scope>.>``, nats-server 2.11+); None when the server did not give them all."""
        nc = self._nc
        inbox = nc.new_inbox()
        msgs: dict[str, tuple[bytes, int]] = {}
        end: asyncio.Future[tuple[str, dict[str, str]]] = asyncio.get_running_loop().create_future()

        async def on_msg(msg: Msg) -> None:
            headers = msg.headers or {}
            status = headers.get("Status")
            if status is None:
                msgs[headers.get("Nats-Subject", "")] = (bytes(msg.data), int(headers.get(PARTS_HEADER, "1")))
            elif not end.done():
                end.set_result((status, headers))

        sub = await nc.subscribe(inbox, cb=on_msg)
        try:
            body = json.dumps({"multi_last": [f"{self.stream}.{scope}.>"], "batch": _BATCH}).encode()
            await nc.publish(f"$JS.API.DIRECT.GET.{self.stream}", body, reply=inbox)
            status, headers = await asyncio.wait_for(end, timeout=10)
        except TimeoutError:
            return None
        finally:
            await sub.unsubscribe()
        if status == "404":  # nothing stored under the scope
            return {}
        if status != "204" or int(headers.get("Nats-Num-Pending", "0") or 0) > 0:
            return None
        return msgs

    async def last_seq(self) -> int:
        await self.ensure()
        info = await self._js.stream_info(self.stream)
        return int(info.state.last_seq)

    async def purge(self, scope: str, *, below_seq: int | None = None) -> None:
        """Delete a scope's payloads (only those stored at payload-stream sequences below ``below_seq``)."""
        await self.ensure()
        try:
            await self._js.purge_stream(self.stream, subject=f"{self.stream}.{scope}.>", seq=below_seq)
        except (nats.errors.Error, nats.js.errors.Error) as exc:
            raise PayloadStoreError(f"purging payloads of {scope}: {exc}") from exc

    async def usage(self) -> tuple[int, int]:
        """(messages, bytes) the payload stream holds."""
        await self.ensure()
        info = await self._js.stream_info(self.stream)
        return int(info.state.messages), int(info.state.bytes)


def _assemble(msgs: dict[str, tuple[bytes, int]], subject: str) -> bytes | None:
    first = msgs.get(subject)
    if first is None:
        return None
    data, n = first
    parts = [data]
    for i in range(1, n):
        part = msgs.get(f"{subject}.{i}")
        if part is None:
            return None
        parts.append(part[0])
    return b"".join(parts)
