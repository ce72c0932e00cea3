"""The recorder's outbox: model-call events between an answered call and the event log.

An append-only SQLite table, one file under the data dir. ``put`` returns once the event is committed with
``synchronous=FULL`` (fsync'd); events that arrive while a commit runs go into the next one (group commit), so
concurrent calls share an fsync. Rows leave only when the log has acknowledged them (``remove``), together with
the highest stream sequence acknowledged so far (``confirmed_seq``): every event of this outbox that is in the
log but still a row here sits after that sequence, which is what lets a restarted drainer find out which rows
the log already holds (see ``_recorder``). Without a path the table lives in memory: the same code, without
surviving a crash of the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import logging
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import IO, Any

from opengyre.events import EventRegistry, ModelCallRecorded, default_registry

__all__ = ["Outbox", "OutboxError"]

log = logging.getLogger(__name__)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,"
    " type_name TEXT NOT NULL, version INTEGER NOT NULL, body BLOB NOT NULL)",
    "CREATE TABLE IF NOT EXISTS outbox_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    # Rows that no longer decode (an event type this build does not know): kept for an operator, never dropped.
    "CREATE TABLE IF NOT EXISTS outbox_undecodable (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL,"
    " type_name TEXT NOT NULL, version INTEGER NOT NULL, body BLOB NOT NULL, reason TEXT NOT NULL)",
)


class OutboxError(Exception):
    """The outbox could not take or give back events (the disk, a second process on the same file)."""


class Outbox:
    def __init__(
        self,
        path: Path | None,
        *,
        registry: EventRegistry | None = None,
        cache_bytes: int = 64 << 20,
        fsync: bool = True,
    ) -> None:
        """``fsync=False`` commits without fsync (SQLite ``synchronous=NORMAL`` in WAL mode): an event then
        survives the process being killed, but not the machine losing power or crashing."""
        self.path = path
        self.fsync = fsync
        self.registry = registry or default_registry()
        self.cache_bytes = cache_bytes
        self.pending = 0  # events put and not yet removed (including those being committed)
        self.pending_bytes = 0
        self.left_by_previous = 0  # rows found at open: a previous process put them and did not remove them
        self.confirmed_seq: int | None = None
        self.undecodable = 0
        self._db: sqlite3.Connection | None = None
        self._lock: IO[bytes] | None = None
        # One thread owns the SQLite connection; every statement runs there, in submission order.
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="proxy-outbox")
        self._next_id = 1
        self._staged: list[tuple[ModelCallRecorded, bytes, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None
        # Rows put by this process, to skip decoding them again (up to cache_bytes of their encoded size).
        self._cache: dict[int, tuple[ModelCallRecorded, int]] = {}
        self._cached_bytes = 0
        self._committed = 0  # rows in the table
        self._rows = asyncio.Event()  # set while rows wait to be drained
        self._empty = asyncio.Event()
        self._empty.set()

    # --- lifecycle ------------------------------------------------------------------------------------

    async def open(self) -> Outbox:
        await self._run(self._open)
        if self._committed:
            self._rows.set()
            self._empty.clear()
        if self.left_by_previous:
            log.warning(
                "the outbox %s holds %d model-call events a previous run did not hand to the log: draining them",
                self.path,
                self.left_by_previous,
            )
        return self

    def _open(self) -> None:
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(str(self.path) + ".lock", "wb")  # noqa: SIM115 - held until close()
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                lock.close()
                raise OutboxError(f"another process is using the outbox {self.path}") from exc
            self._lock = lock
        db = sqlite3.connect(":memory:" if self.path is None else str(self.path), isolation_level=None)
        try:
            if self.path is not None:
                db.execute("PRAGMA journal_mode=WAL")
                # FULL: a commit is fsync'd before put() returns; NORMAL: written to the OS before it returns.
                db.execute(f"PRAGMA synchronous={'FULL' if self.fsync else 'NORMAL'}")
            for stmt in _SCHEMA:
                db.execute(stmt)
            n, size, last = db.execute(
                "SELECT count(*), coalesce(sum(length(body)), 0), coalesce(max(id), 0) FROM outbox"
            ).fetchone()
            row = db.execute("SELECT value FROM outbox_meta WHERE key = 'confirmed_seq'").fetchone()
        except BaseException:
            db.close()
            raise
        self._db = db
        self.pending = self.left_by_previous = self._committed = int(n)
        self.pending_bytes = int(size)
        self._next_id = int(last) + 1
        self.confirmed_seq = int(row[0]) if row else None

    async def close(self) -> None:
        if self._writer is not None:
            with contextlib.suppress(Exception):
                await self._writer
        with contextlib.suppress(Exception):
            await self._run(self._close)
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    async def _run(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    # --- put ------------------------------------------------------------------------------------------

    async def put(self, event: ModelCallRecorded) -> None:
        """Return once ``event`` is committed (fsync'd with a file); raises OutboxError if it could not be."""
        body = self.registry.encode(event)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._staged.append((event, body, fut))
        self.pending += 1
        self.pending_bytes += len(body)
        self._empty.clear()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_staged(), name="proxy-outbox-writer")
        # Shielded: a caller that goes away does not take the commit, or the other calls in it, along.
        await asyncio.shield(fut)

    async def _write_staged(self) -> None:
        while self._staged:
            group, self._staged = self._staged, []
            first = self._next_id
            self._next_id += len(group)
            rows = [(first + i, e.event_id, e.type_name(), e.version, body) for i, (e, body, _) in enumerate(group)]
            try:
                await self._run(self._insert, rows)
            except Exception as exc:
                self.pending -= len(group)
                self.pending_bytes -= sum(len(b) for _, b, _ in group)
                if self.pending == 0:
                    self._empty.set()
                err = OutboxError(f"writing {len(group)} model-call events to the outbox failed: {exc}")
                log.error("%s", err)
                for _, _, fut in group:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            for i, (e, body, _) in enumerate(group):
                if self._cached_bytes + len(body) <= self.cache_bytes:
                    self._cache[first + i] = (e, len(body))
                    self._cached_bytes += len(body)
            self._committed += len(group)
            self._rows.set()
            for _, _, fut in group:
                if not fut.done():
                    fut.set_result(None)

    def _insert(self, rows: list[tuple[int, str, str, int, bytes]]) -> None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            db.executemany("INSERT INTO outbox (id, event_id, type_name, version, body) VALUES (?, ?, ?, ?, ?)", rows)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise OutboxError("the outbox is not open")
        return self._db

    # --- drain ----------------------------------------------------------------------------------------

    async def wait_rows(self) -> None:
        await self._rows.wait()

    async def wait_empty(self) -> None:
        await self._empty.wait()

    async def head(self, n: int) -> list[tuple[int, ModelCallRecorded]]:
        """The first ``n`` rows in the order they were put (an undecodable row is set aside, never returned)."""
        ids: list[int] = await self._run(self._head_ids, n)
        missing = [i for i in ids if i not in self._cache]
        decoded: dict[int, ModelCallRecorded] = {}
        if missing:
            bad: list[tuple[int, str]] = []
            for row_id, type_name, version, body in await self._run(self._bodies, missing):
                try:
                    e = self.registry.decode(type_name, version, body)
                    if not isinstance(e, ModelCallRecorded):
                        raise TypeError(f"a {type_name} event is not a model call")
                    decoded[row_id] = e
                except Exception as exc:
                    bad.append((row_id, f"{type(exc).__name__}: {exc}"))
            if bad:
                sizes: int = await self._run(self._set_aside, bad)
                self.undecodable += len(bad)
                self._forget([i for i, _ in bad], sizes)
                log.error("%d outbox rows do not decode; kept in outbox_undecodable: %s", len(bad), bad[:3])
        out: list[tuple[int, ModelCallRecorded]] = []
        for i in ids:
            cached = self._cache.get(i)
            got = cached[0] if cached is not None else decoded.get(i)
            if got is not None:
                out.append((i, got))
        return out

    def _head_ids(self, n: int) -> list[int]:
        return [r[0] for r in self._conn().execute("SELECT id FROM outbox ORDER BY id LIMIT ?", (n,))]

    def _bodies(self, ids: list[int]) -> list[tuple[int, str, int, bytes]]:
        marks = ",".join("?" * len(ids))
        q = f"SELECT id, type_name, version, body FROM outbox WHERE id IN ({marks})"
        return [(int(a), str(b), int(c), bytes(d)) for a, b, c, d in self._conn().execute(q, ids)]

    def _set_aside(self, bad: list[tuple[int, str]]) -> int:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            size = 0
            for row_id, reason in bad:
                size += int(db.execute("SELECT length(body) FROM outbox WHERE id = ?", (row_id,)).fetchone()[0])
                db.execute(
                    "INSERT OR REPLACE INTO outbox_undecodable (id, event_id, type_name, version, body, reason)"
                    " SELECT id, event_id, type_name, version, body, ? FROM outbox WHERE id = ?",
                    (reason, row_id),
                )
                db.execute("DELETE FROM outbox WHERE id = ?", (row_id,))
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        return size

    async def rows_with_event_ids(self, event_ids: Iterable[str]) -> list[int]:
        """Which rows hold one of ``event_ids`` (the events the log turned out to have already)."""
        ids = list(event_ids)
        return list(await self._run(self._rows_with, ids)) if ids else []

    def _rows_with(self, event_ids: list[str]) -> list[int]:
        out: list[int] = []
        for k in range(0, len(event_ids), 500):
            part = event_ids[k : k + 500]
            q = f"SELECT id FROM outbox WHERE event_id IN ({','.join('?' * len(part))})"
            out += [int(r[0]) for r in self._conn().execute(q, part)]
        return sorted(out)

    async def remove(self, ids: Sequence[int], confirmed_seq: int, *, sync: bool = False) -> None:
        """Rows the log now holds, and the highest stream sequence known to hold this outbox's events.

        Not fsync'd unless ``sync``: a removal lost with the machine only brings rows back that the drainer
        finds in the log after the older, durable ``confirmed_seq`` (the next put's fsync makes it durable anyway).
        """
        seq = max(confirmed_seq, self.confirmed_seq or 0)
        size: int = await self._run(self._remove, list(ids), seq, sync)
        self.confirmed_seq = seq
        self._forget(ids, size)

    def _remove(self, ids: list[int], seq: int, sync: bool) -> int:
        db = self._conn()
        if self.path is not None and self.fsync and not sync:
            db.execute("PRAGMA synchronous=NORMAL")
        db.execute("BEGIN IMMEDIATE")
        try:
            size = 0
            for k in range(0, len(ids), 500):
                part = ids[k : k + 500]
                marks = ",".join("?" * len(part))
                size += int(
                    db.execute(
                        f"SELECT coalesce(sum(length(body)), 0) FROM outbox WHERE id IN ({marks})",
                        part,
                    ).fetchone()[0]
                )
                db.execute(f"DELETE FROM outbox WHERE id IN ({marks})", part)
            db.execute(
                "INSERT INTO outbox_meta (key, value) VALUES ('confirmed_seq', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (seq,),
            )
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise
        finally:
            if self.path is not None and self.fsync and not sync:
                db.execute("PRAGMA synchronous=FULL")
        return size

    async def set_confirmed(self, seq: int) -> None:
        """Record, durably, a stream position before which no event of this outbox can be (before its first
        publish): a restart that finds no position knows nothing was ever sent."""
        await self.remove([], seq, sync=True)

    def _forget(self, ids: Sequence[int], size: int) -> None:
        for i in ids:
            cached = self._cache.pop(i, None)
            if cached is not None:
                self._cached_bytes -= cached[1]
        self._committed -= len(ids)
        self.pending -= len(ids)
        self.pending_bytes -= size
        if self._committed == 0:
            self._rows.clear()
        if self.pending == 0:
            self._empty.set()
