"""Reading an out-of-band body, telling a blob that is gone for good from a store that is away for now.

A missing or corrupt blob is permanent: the message that names it is a dead letter like any other poison
message (:class:`BlobUnreadable`). A server that does not answer is transient: nats-py's timeouts and
no-responder errors pass through, and the reader waits them out; they never dead-letter anything.
"""

from __future__ import annotations

import asyncio
import logging

import msgspec
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.object_store import ObjectStore

from ._errors import EventLogError
from ._stored import StoredEvent

log = logging.getLogger(__name__)

__all__ = ["BLOB_CORRUPT", "BLOB_MISSING", "BlobReader", "BlobStore", "BlobUnreadable"]

BLOB_MISSING = "blob-missing"
BLOB_CORRUPT = "blob-corrupt"

# Bounds nats-py's ordered-consumer read, which waits for ever on a chunk that never comes; reaching it is
# reported as a timeout (transient): the chunk count is checked first, so a lost chunk is already "corrupt".
_GET_TIMEOUT_S = 60.0


class BlobUnreadable(EventLogError):
    """An out-of-band body that will never read back: ``reason`` is ``blob-missing`` or ``blob-corrupt``."""

    def __init__(self, reason: str, ref: str, detail: str) -> None:
        super().__init__(f"{reason}: blob {ref!r}: {detail}")
        self.reason = reason
        self.ref = ref
        self.detail = detail


class BlobReader:
    """Reads blobs of one object-store bucket; never creates the bucket (a read must not change the log)."""

    def __init__(self, js: JetStreamContext, bucket: str, replicas: int = 1) -> None:
        self._js = js
        self._bucket = bucket
        self._replicas = replicas  # as the event stream's: a body out of band outlives a server as its event does
        self._store: ObjectStore | None = None

    async def _open(self, ref: str) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self._js.object_store(self._bucket)
            except (nats.js.errors.BucketNotFoundError, nats.js.errors.NotFoundError) as exc:
                raise BlobUnreadable(BLOB_MISSING, ref, f"the object store {self._bucket} does not exist") from exc
        return self._store

    async def read(self, ref: str) -> bytes:
        store = await self._open(ref)
        try:
            info = await store.get_info(ref)
        except nats.js.errors.ObjectNotFoundError as exc:
            raise BlobUnreadable(BLOB_MISSING, ref, f"no such object in {self._bucket}") from exc
        except (nats.js.errors.BadObjectMetaError, nats.js.errors.InvalidObjectNameError) as exc:
            raise BlobUnreadable(BLOB_CORRUPT, ref, f"unreadable object metadata ({type(exc).__name__})") from exc
        if not info.nuid:
            raise BlobUnreadable(BLOB_CORRUPT, ref, "object metadata without a chunk id")
        if info.size:
            chunks = f"$O.{self._bucket}.C.{info.nuid}"
            try:
                si = await self._js.stream_info(f"OBJ_{self._bucket}", subjects_filter=chunks)
            except nats.js.errors.NotFoundError as exc:  # the bucket went away after its metadata was read
                raise BlobUnreadable(BLOB_MISSING, ref, f"the object store {self._bucket} does not exist") from exc
            have = sum((si.state.subjects or {}).values())
            if have != (info.chunks or 0):
                raise BlobUnreadable(BLOB_CORRUPT, ref, f"{have} of its {info.chunks} chunks are in the store")
        try:
            res = await asyncio.wait_for(store.get(ref), _GET_TIMEOUT_S)
        except nats.js.errors.DigestMismatchError as exc:
            raise BlobUnreadable(BLOB_CORRUPT, ref, "its chunks do not match its digest") from exc
        except nats.js.errors.ObjectNotFoundError as exc:  # removed between the two reads
            raise BlobUnreadable(BLOB_MISSING, ref, f"no such object in {self._bucket}") from exc
        except nats.js.errors.LinkIsABucketError as exc:
            raise BlobUnreadable(BLOB_CORRUPT, ref, "a link to a whole bucket, not a body") from exc
        return bytes(res.data or b"")


class BlobStore:
    """Blobs of the log's bucket: ``put`` creates the bucket on first use, reads never do."""

    def __init__(self, js: JetStreamContext, bucket: str, replicas: int = 1) -> None:
        self._js = js
        self._bucket = bucket
        self._replicas = replicas  # as the event stream's: a body out of band outlives a server as its event does
        self._store: ObjectStore | None = None
        self._reader = BlobReader(js, bucket)

    async def _writable(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self._js.object_store(self._bucket)
            except (nats.js.errors.NotFoundError, nats.js.errors.BucketNotFoundError):
                self._store = await self._js.create_object_store(
                    self._bucket, config=ObjectStoreConfig(storage=StorageType.FILE, replicas=self._replicas)
                )
        return self._store

    async def put(self, name: str, data: bytes) -> str:
        await (await self._writable()).put(name, data)
        return name

    async def read(self, ref: str) -> bytes:
        return await self._reader.read(ref)

    async def resolve(self, stored: StoredEvent, ref: str) -> StoredEvent:
        """The stored event with its out-of-band body, or marked ``unreadable`` if that blob is gone for good."""
        try:
            body = await self._reader.read(ref)
        except BlobUnreadable as exc:
            log.warning("event log seq %d: %s", stored.seq, exc)
            return msgspec.structs.replace(stored, body=b"", unreadable=exc.reason, unreadable_detail=str(exc))
        return msgspec.structs.replace(stored, body=body)
