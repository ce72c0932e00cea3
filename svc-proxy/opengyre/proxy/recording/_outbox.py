"""The recorder's outbox: model-call events between an answered call and the event log.

An append-only SQLite table, one file under the data dir, in WAL mode. ``put`` commits the event at once and
gives a future that completes when the WAL is fsync'd (what SQLite's ``synchronous=FULL`` does); events committed
while an fsync runs share the next one (group fsync). Rows leave only when the log has acknowledged
them (``remove``), together with the highest stream sequence acknowledged so far (``confirmed_seq``): every event
of this outbox that is in the log but still a row here sits after that sequence, which is what lets a restarted
drainer find out which rows the log already holds (see ``_recorder``). Without a path the table lives in memory:
the same code, without surviving a crash of the process.

Per execution the outbox also keeps how many calls were put (``calls``, in the same transaction as the row, so it
outlives the rows) and whether the execution is sealed (``seal``): a sealed execution's calls are refused
(``ExecutionSealed``), so once its rows have left (``wait_flushed``) the log holds exactly ``calls`` of them. The
seal is durable like the rows: a restarted proxy still refuses the execution's calls. Once the log holds the
execution's sealed finish (``execution-finished`` with the count) its row is pruned (``prune``): from then on
``sealed_in_log`` — the proxy's projection of those finishes — answers for it, consulted only for an execution
the table does not know (its first call, or a pruned one), so the table holds only executions in progress.

Only the proxy writes the outbox, and what it drains is checked (a row written by anyone else is never published):
the file, its WAL and lock are 0600 and a folder it makes 0700 (an existing file or folder of this user's is
narrowed to that at open); each row carries an integrity tag, HMAC-SHA256 over the row's id, event id, type,
version, execution and body under a key derived from the proxy's secret (``proxy.secret``, or the gateway's
secret when it has one). A row the drainer reads back (one this process did not put, e.g. after a restart) is
handed to the log only if its tag verifies and its execution is one this outbox recorded a call of and, if it is
sealed, the row was put before the seal (``sealed_at``: the first row id after it). Any other row is moved to
``outbox_quarantine`` with the reason (never deleted), logged and counted (``quarantined``; ``/metrics``). Rows
of a file written before tags existed (no ``tag`` column) are adopted once, with a warning: that build trusted
them too.

The statements run on the event loop's thread (microseconds: the WAL is appended to, not synced); only the fsync
and the WAL checkpoints go to a worker thread. A hop to a thread per statement cost milliseconds a call on a
loaded machine (each hop waits for the scheduler). The drainer sees a row only once its fsync completed.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import fcntl
import hashlib
import hmac
import logging
import os
import secrets
import sqlite3
import struct
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from opengyre.events import EventRegistry, ModelCallRecorded, default_registry

from .._keys import derive_key, load_or_create_secret

__all__ = ["QUARANTINE_REASONS", "ExecutionSealed", "Outbox", "OutboxError", "RecordFailed", "outbox_key", "row_tag"]

log = logging.getLogger(__name__)

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE,"
    " type_name TEXT NOT NULL, version INTEGER NOT NULL, body BLOB NOT NULL, execution_id TEXT, tag BLOB)",
    # Calls put per execution (rows leave, the count stays), its seal (1: no call is put after) and the first row
    # id after the seal (a row from there on was not put by this proxy).
    "CREATE TABLE IF NOT EXISTS outbox_executions (execution_id TEXT PRIMARY KEY, calls INTEGER NOT NULL,"
    " sealed INTEGER NOT NULL, sealed_at INTEGER)",
    "CREATE TABLE IF NOT EXISTS outbox_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    # Rows never handed to the log: undecodable, or not the proxy's (their tag or execution fails the check).
    # Kept as they were, with the reason, for an operator; never dropped.
    "CREATE TABLE IF NOT EXISTS outbox_quarantine (qid INTEGER PRIMARY KEY, id INTEGER NOT NULL,"
    " event_id TEXT NOT NULL, type_name TEXT NOT NULL, version INTEGER NOT NULL, body BLOB NOT NULL,"
    " execution_id TEXT, tag BLOB, reason TEXT NOT NULL, detail TEXT NOT NULL)",
)
# Columns later builds added, for a file an older build made.
_ADDED_COLUMNS = (
    ("outbox", "execution_id", "TEXT"),
    ("outbox", "tag", "BLOB"),
    ("outbox_executions", "sealed_at", "INTEGER"),
)
_TAG_PURPOSE = "outbox-row-tag/v1"
# Why a row is quarantined instead of published.
QUARANTINE_REASONS = ("no-tag", "bad-tag", "unknown-execution", "sealed-execution", "after-seal", "undecodable")

_CHECKPOINT_BYTES = 8 << 20  # copy the WAL into the database (off the loop) once it is this large


class RecordFailed(Exception):
    """A call's event could not be made durable: the call must not be answered as a success."""


class OutboxError(RecordFailed):
    """The outbox could not take or give back events (the disk, a second process on the same file)."""


class ExecutionSealed(RecordFailed):
    """The execution was sealed (its rollout ended): it takes no more calls."""

    def __init__(self, execution_id: str) -> None:
        super().__init__(f"execution {execution_id} is sealed (its rollout ended): it takes no more model calls")
        self.execution_id = execution_id


def outbox_key(secret: bytes) -> bytes:
    """The outbox's tag key, derived from the proxy's secret (never the secret itself)."""
    return derive_key(secret, _TAG_PURPOSE)


def row_tag(
    key: bytes, row: int, event_id: str, type_name: str, version: int, execution_id: str | None, body: bytes
) -> bytes:
    """HMAC-SHA256 of a row: every field length-prefixed, so no two rows share the bytes that are signed."""
    mac = hmac.new(key, struct.pack(">qq", row, version), hashlib.sha256)
    for part in (event_id.encode(), type_name.encode(), (execution_id or "").encode(), body):
        mac.update(struct.pack(">I", len(part)))
        mac.update(part)
    return mac.digest()


class Outbox:
    def __init__(
        self,
        path: Path | None,
        *,
        registry: EventRegistry | None = None,
        cache_bytes: int = 64 << 20,
        fsync: bool = True,
        sealed_in_log: Callable[[str], int | None] | None = None,
        secret: bytes | None = None,
    ) -> None:
        """``fsync=False``: commits are written to the OS but not fsync'd (SQLite ``synchronous=NORMAL``); an
        event then survives the process being killed, but not the machine losing power or crashing.
        ``sealed_in_log(execution)``: the count of recorded calls of the execution's sealed finish in the log, None
        without one (what lets ``prune`` forget a seal). ``secret``: the proxy's secret the rows' tag key derives
        from; None: the ``proxy.secret`` beside the file (made if missing), in memory a random one."""
        self.path = path
        self._secret = secret
        self.sealed_in_log = sealed_in_log
        self.fsync = fsync and path is not None
        self.registry = registry or default_registry()
        self.cache_bytes = cache_bytes
        self.pending = 0  # events put and not yet removed (including those being committed)
        self.pending_bytes = 0
        self.left_by_previous = 0  # rows found at open: a previous process put them and did not remove them
        self.confirmed_seq: int | None = None
        self.quarantined: collections.Counter[str] = collections.Counter()  # rows set aside, by reason
        self.adopted = 0  # rows of an older build's file (no tags yet) tagged at open
        self._key = b""
        self._db: sqlite3.Connection | None = None
        self._wal: int | None = None  # a descriptor of the WAL file, to fsync it
        self._lock: IO[bytes] | None = None
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="proxy-outbox")
        self._checkpoint: asyncio.Future[None] | None = None
        self._unchecked = 0  # bytes committed since the last checkpoint began
        self._next_id = 1
        self._visible_below = 1  # rows from here on wait for their fsync: not drained yet
        self._unsynced: list[tuple[int, int, asyncio.Future[None]]] = []  # (row, size, its caller's future)
        self._syncer: asyncio.Task[None] | None = None
        self.failed = 0  # events whose commit or fsync failed
        # Rows put by this process, to skip decoding them again (up to cache_bytes of their encoded size).
        self._cache: dict[int, tuple[ModelCallRecorded, int]] = {}
        self._cached_bytes = 0
        self._committed = 0  # rows in the table
        self._rows = asyncio.Event()  # set while rows wait to be drained
        self._empty = asyncio.Event()
        self._empty.set()
        # Rows not yet removed that this process counts (put, or found at open), by execution (None: a row of an
        # older build without one); what ``wait_flushed`` waits on, and who waits.
        self._row_execution: dict[int, str | None] = {}
        self._execution_rows: dict[str, int] = {}
        # ``outbox_executions`` as committed, (calls, sealed, sealed_at) by execution: read on every call (is it
        # sealed?) twice, and only this process writes the table (the file is locked), so each write updates it
        # after its transaction commits. A query per read was ~3 % of the gateway's CPU per call.
        self._executions: dict[str, tuple[int, bool, int | None]] = {}
        self._flushed: dict[str, asyncio.Event] = {}

    # --- lifecycle ------------------------------------------------------------------------------------

    async def open(self) -> Outbox:
        try:
            await asyncio.to_thread(self._take_lock)
            self._open_db()
        except BaseException:
            self._close()
            raise
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

    def _take_lock(self) -> None:
        if self.path is None:
            self._key = outbox_key(self._secret or secrets.token_bytes(32))
            return
        _private_dir(self.path.parent)
        # The lock file is private too (a reader of it could hold the flock and keep the proxy from starting).
        lock = os.fdopen(os.open(str(self.path) + ".lock", os.O_WRONLY | os.O_CREAT, 0o600), "wb")
        try:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            lock.close()
            raise OutboxError(f"another process is using the outbox {self.path}") from exc
        self._lock = lock
        secret = self._secret if self._secret is not None else load_or_create_secret(self.path.parent / "proxy.secret")
        self._key = outbox_key(secret)
        # SQLite makes the WAL and shm files with the database file's mode: 0600 from the start (an older build's
        # files, made with the umask's mode, are narrowed).
        os.close(os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600))
        for f in (self.path, Path(f"{self.path}-wal"), Path(f"{self.path}-shm"), Path(str(self.path) + ".lock")):
            _private_file(f)

    def _open_db(self) -> None:
        db = sqlite3.connect(":memory:" if self.path is None else str(self.path), isolation_level=None)
        self._db = db
        if self.path is not None:
            db.execute("PRAGMA journal_mode=WAL")
            # Commits append to the WAL without a sync; put() fsyncs the WAL itself, off the loop, which is what
            # synchronous=FULL would do on the loop. Checkpoints are ours too (off the loop).
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA wal_autocheckpoint=0")
        for stmt in _SCHEMA:
            db.execute(stmt)
        untagged = False
        for table, column, kind in _ADDED_COLUMNS:  # a file an older build made
            if column not in [r[1] for r in db.execute(f"PRAGMA table_info({table})")]:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
                untagged |= column == "tag"
        if self.path is not None:
            self._wal = os.open(f"{self.path}-wal", os.O_RDONLY)  # the schema statements created it
            _private_file(Path(f"{self.path}-wal"))
            _private_file(Path(f"{self.path}-shm"))
        if untagged:
            self._adopt()
        n, size, last = db.execute(
            "SELECT count(*), coalesce(sum(length(body)), 0), coalesce(max(id), 0) FROM outbox"
        ).fetchone()
        (after_seal,) = db.execute("SELECT coalesce(max(sealed_at), 0) FROM outbox_executions").fetchone()
        known = db.execute("SELECT execution_id, calls, sealed, sealed_at FROM outbox_executions")
        self._executions = {
            str(x): (int(calls), bool(sealed), None if at is None else int(at)) for x, calls, sealed, at in known
        }
        row = db.execute("SELECT value FROM outbox_meta WHERE key = 'confirmed_seq'").fetchone()
        self.pending = self.left_by_previous = self._committed = int(n)
        self.pending_bytes = int(size)
        self._visible_below = int(last) + 1
        # Never below a seal's mark: a row put now is after every seal made so far.
        self._next_id = max(int(last) + 1, int(after_seal))
        self.confirmed_seq = int(row[0]) if row else None
        for row_id, execution_id, type_name, version, body in db.execute(
            "SELECT id, execution_id, type_name, version, CASE WHEN execution_id IS NULL THEN body END FROM outbox"
        ):
            if execution_id is None:  # put by an older build: the event knows
                with contextlib.suppress(Exception):
                    execution_id = getattr(self.registry.decode(type_name, version, body), "execution_id", None)
            self._track(int(row_id), str(execution_id) if execution_id is not None else None)

    def _adopt(self) -> None:
        """Tag the rows of a file an older build wrote (it had no tags, and trusted its rows): once, logged."""
        db = self._conn()
        rows = db.execute("SELECT id, event_id, type_name, version, execution_id, body FROM outbox").fetchall()
        self._transaction(("UPDATE outbox SET tag = ? WHERE id = ?", (row_tag(self._key, *r), r[0])) for r in rows)
        self.adopted = len(rows)
        if rows:
            log.warning(
                "the outbox %s was written by a build without row tags: its %d rows are adopted (tagged now)",
                self.path,
                len(rows),
            )

    async def close(self) -> None:
        if self._syncer is not None:
            with contextlib.suppress(Exception):
                await self._syncer
        if self._checkpoint is not None:
            with contextlib.suppress(Exception):
                await self._checkpoint
        self._close()
        self._thread.shutdown(wait=True)

    def _close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None
        if self._wal is not None:
            os.close(self._wal)
            self._wal = None
        if self._lock is not None:
            self._lock.close()  # releases the flock
            self._lock = None

    @property
    def is_open(self) -> bool:
        return self._db is not None

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise OutboxError("the outbox is not open")
        return self._db

    def _transaction(self, statements: Iterable[tuple[str, Sequence[object]]]) -> None:
        db = self._conn()
        db.execute("BEGIN IMMEDIATE")
        try:
            for sql, args in statements:
                db.execute(sql, args)
            db.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(sqlite3.Error):
                db.execute("ROLLBACK")
            raise

    def _checkpointed(self, fut: asyncio.Future[None]) -> None:
        self._checkpoint = None
        if not fut.cancelled() and fut.exception() is not None:
            log.warning("outbox checkpoint failed: %s", fut.exception())

    # --- put ------------------------------------------------------------------------------------------

    def put(self, event: ModelCallRecorded) -> asyncio.Future[None] | None:
        """Commit ``event`` now; None if that is all (in memory, or ``fsync=False``), else a future that completes
        once an fsync covers it (calls that commit while one runs share the next). Raises, or fails the future
        with, OutboxError if the event could not be made durable; InvalidEvent for one no store could keep."""
        if self.sealed(event.execution_id):
            raise ExecutionSealed(event.execution_id)
        body = self.registry.encode(event)
        row = self._next_id
        eid = event.execution_id
        insert = (
            "INSERT INTO outbox (id, event_id, type_name, version, body, execution_id, tag)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)"
        )
        count = (
            "INSERT INTO outbox_executions (execution_id, calls, sealed) VALUES (?, 1, 0)"
            " ON CONFLICT (execution_id) DO UPDATE SET calls = calls + 1"
        )
        fields = (row, event.event_id, event.type_name(), event.version, eid, body)
        try:
            self._transaction([(insert, (*fields[:4], body, eid, row_tag(self._key, *fields))), (count, (eid,))])
        except Exception as exc:
            self.failed += 1
            raise OutboxError(f"writing a model-call event to the outbox failed: {exc}") from exc
        self._next_id += 1
        calls, sealed, sealed_at = self._executions.get(eid, (0, False, None))
        self._executions[eid] = (calls + 1, sealed, sealed_at)
        self._track(row, eid)
        self.pending += 1
        self.pending_bytes += len(body)
        self._unchecked += len(body)
        self._empty.clear()
        if self._cached_bytes + len(body) <= self.cache_bytes:
            self._cache[row] = (event, len(body))
            self._cached_bytes += len(body)
        if not self.fsync:
            self._drainable(row + 1, 1)
            self._maybe_checkpoint()
            return None
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._unsynced.append((row, len(body), fut))
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.create_task(self._sync_committed(), name="proxy-outbox-fsync")
        return fut

    def _drainable(self, below: int, n: int) -> None:
        """Rows under ``below`` may go to the log (``n`` more of them)."""
        self._visible_below = below
        self._committed += n
        self._rows.set()

    async def _sync_committed(self) -> None:
        """fsync the WAL for every commit not yet covered, off the loop, until none is left (group fsync)."""
        assert self._wal is not None
        loop = asyncio.get_running_loop()
        while self._unsynced:
            group, self._unsynced = self._unsynced, []
            last = group[-1][0]
            try:
                await loop.run_in_executor(self._thread, os.fsync, self._wal)
            except Exception as exc:
                err = OutboxError(f"syncing {len(group)} model-call events to disk failed: {exc}")
                log.error("%s", err)
                self.failed += len(group)
                if self._take_back(group[0][0], last):
                    for r, size, _ in group:
                        cached = self._cache.pop(r, None)
                        self._cached_bytes -= cached[1] if cached is not None else 0
                        self.pending -= 1
                        self.pending_bytes -= size
                    self._untrack([r for r, _, _ in group])
                    if self.pending == 0:
                        self._empty.set()
                    self._visible_below = last + 1
                else:  # in the table and cannot be taken back: drained like any other row
                    self._drainable(last + 1, len(group))
                for _, _, fut in group:
                    if not fut.done():
                        fut.set_exception(err)
                continue
            # The callers first: the drainer is woken after them (a call's answer goes out before its event does).
            for _, _, fut in group:
                if not fut.done():
                    fut.set_result(None)
            self._drainable(last + 1, len(group))
            self._maybe_checkpoint()

    def _take_back(self, first: int, last: int) -> bool:
        """Delete the rows of a group whose fsync failed (their calls are answered with an error); False if they
        are in the table and stay there."""
        uncount = "UPDATE outbox_executions SET calls = calls - 1 WHERE execution_id = ?"
        taken = [e for r in range(first, last + 1) if (e := self._row_execution.get(r)) is not None]
        try:
            self._transaction(
                [("DELETE FROM outbox WHERE id >= ? AND id <= ?", (first, last)), *((uncount, (e,)) for e in taken)]
            )
            for e in taken:
                if (known := self._executions.get(e)) is not None:
                    self._executions[e] = (known[0] - 1, known[1], known[2])
        except Exception:
            try:
                row = self._conn().execute("SELECT 1 FROM outbox WHERE id = ?", (first,)).fetchone()
            except Exception:
                return False
            return row is None
        return True

    def _maybe_checkpoint(self) -> None:
        if self._wal is None or self._checkpoint is not None or self._unchecked <= _CHECKPOINT_BYTES:
            return
        self._unchecked = 0
        self._checkpoint = asyncio.get_running_loop().run_in_executor(self._thread, _checkpoint, str(self.path))
        self._checkpoint.add_done_callback(self._checkpointed)

    # --- drain ----------------------------------------------------------------------------------------

    async def wait_rows(self) -> None:
        await self._rows.wait()

    async def wait_empty(self) -> None:
        await self._empty.wait()

    async def head(self, n: int) -> list[tuple[int, ModelCallRecorded]]:
        """The first ``n`` rows in the order they were put. A row this process did not put is checked first
        (``_tag_refusal``, ``_execution_refusal``); one that fails, or does not decode, is quarantined, never
        returned."""
        db = self._conn()
        q = "SELECT id FROM outbox WHERE id < ? ORDER BY id LIMIT ?"
        ids = [int(r[0]) for r in db.execute(q, (self._visible_below, n))]
        if not ids and self._committed:
            log.error("the outbox counted %d rows to drain but holds none: recounting", self._committed)
            self._committed = 0
            self._rows.clear()
        missing = [i for i in ids if i not in self._cache]
        decoded: dict[int, ModelCallRecorded] = {}
        if missing:
            bad: list[tuple[int, str, str]] = []
            q = (
                "SELECT id, event_id, type_name, version, execution_id, body, tag FROM outbox"
                f" WHERE id IN ({','.join('?' * len(missing))})"
            )
            for row_id, event_id, type_name, version, execution_id, body, tag in db.execute(q, missing):
                got = self._checked(row_id, event_id, type_name, version, execution_id, body, tag)
                if isinstance(got, tuple):
                    bad.append((row_id, *got))
                else:
                    decoded[row_id] = got
            if bad:
                self._quarantine(bad)
        out: list[tuple[int, ModelCallRecorded]] = []
        for i in ids:
            cached = self._cache.get(i)
            event = cached[0] if cached is not None else decoded.get(i)
            if event is not None:
                out.append((i, event))
        return out

    def _checked(
        self,
        row_id: int,
        event_id: str,
        type_name: str,
        version: int,
        execution_id: str | None,
        body: bytes,
        tag: bytes | None,
    ) -> ModelCallRecorded | tuple[str, str]:
        """The row's event if it may go to the log, else why not (a reason code and what it means)."""
        refused = self._tag_refusal(row_id, event_id, type_name, version, execution_id, body, tag)
        if refused is not None:
            return refused
        try:
            e = self.registry.decode(type_name, version, body)
            if not isinstance(e, ModelCallRecorded):
                raise TypeError(f"a {type_name} event is not a model call")
            if e.event_id != event_id or execution_id not in (None, e.execution_id):
                raise ValueError("the row's event id or execution is not its event's")
        except Exception as exc:
            return "undecodable", f"{type(exc).__name__}: {exc}"
        return self._execution_refusal(row_id, e.execution_id) or e

    def _tag_refusal(
        self,
        row_id: int,
        event_id: str,
        type_name: str,
        version: int,
        execution_id: str | None,
        body: bytes,
        tag: bytes | None,
    ) -> tuple[str, str] | None:
        """Why a row read back is not the proxy's (a reason code and what it means), or None."""
        if tag is None:
            return "no-tag", "the row carries no integrity tag: the proxy did not write it"
        want = row_tag(self._key, row_id, event_id, type_name, version, execution_id, body)
        if not hmac.compare_digest(bytes(tag), want):
            return "bad-tag", "the row's integrity tag does not verify: the proxy did not write it as it is"
        return None

    def _execution_refusal(self, row_id: int, execution_id: str) -> tuple[str, str] | None:
        """Why a row of ``execution_id`` must not reach the log: its execution is not one this outbox recorded a
        call of, or the row follows the execution's seal. None: it may go."""
        known = self._execution_row(execution_id)
        if known is None:
            if self.sealed_in_log is not None and self.sealed_in_log(execution_id) is not None:
                return "sealed-execution", f"execution {execution_id} is sealed and its finish is in the log"
            return "unknown-execution", f"the outbox never recorded a call of execution {execution_id}"
        _, sealed, sealed_at = known
        if sealed and sealed_at is not None and row_id >= sealed_at:
            return "after-seal", f"the row follows the seal of execution {execution_id} (no call is put after it)"
        return None

    def _quarantine(self, bad: list[tuple[int, str, str]]) -> None:
        """Move rows aside (``outbox_quarantine``, with why), in one transaction; log and count them."""
        ids = [i for i, _, _ in bad]
        counted = [i for i in ids if i in self._row_execution]
        size = self._size(counted)
        self._transaction(
            [
                stmt
                for row_id, reason, detail in bad
                for stmt in (
                    (
                        "INSERT INTO outbox_quarantine"
                        " (id, event_id, type_name, version, body, execution_id, tag, reason, detail)"
                        " SELECT id, event_id, type_name, version, body, execution_id, tag, ?, ? FROM outbox"
                        " WHERE id = ?",
                        (reason, detail, row_id),
                    ),
                    ("DELETE FROM outbox WHERE id = ?", (row_id,)),
                )
            ]
        )
        self.quarantined.update(reason for _, reason, _ in bad)
        self._forget(counted, size)
        for row_id, reason, detail in bad:
            log.error("outbox row %d quarantined, not published (%s): %s", row_id, reason, detail)

    def quarantine_rows(self) -> int:
        """Rows in ``outbox_quarantine`` (every run of this file)."""
        return int(self._conn().execute("SELECT count(*) FROM outbox_quarantine").fetchone()[0])

    def _size(self, ids: Sequence[int]) -> int:
        size = 0
        for k in range(0, len(ids), 500):
            part = list(ids[k : k + 500])
            q = f"SELECT coalesce(sum(length(body)), 0) FROM outbox WHERE id IN ({','.join('?' * len(part))})"
            size += int(self._conn().execute(q, part).fetchone()[0])
        return size

    async def rows_with_event_ids(self, event_ids: Iterable[str]) -> list[int]:
        """Which rows hold one of ``event_ids`` (the events the log turned out to have already)."""
        ids = list(event_ids)
        out: list[int] = []
        for k in range(0, len(ids), 500):
            part = ids[k : k + 500]
            q = f"SELECT id FROM outbox WHERE id < ? AND event_id IN ({','.join('?' * len(part))})"
            out += [int(r[0]) for r in self._conn().execute(q, [self._visible_below, *part])]
        return sorted(out)

    async def remove(self, ids: Sequence[int], confirmed_seq: int, *, sync: bool = False) -> None:
        """Rows the log now holds, and the highest stream sequence known to hold this outbox's events.

        Not fsync'd unless ``sync``: a removal lost with the machine only brings back rows that the drainer finds
        in the log after the older, durable ``confirmed_seq`` (and the next put's fsync covers it anyway).
        """
        seq = max(confirmed_seq, self.confirmed_seq or 0)
        counted = [i for i in ids if i in self._row_execution]
        size = self._size(counted)
        statements: list[tuple[str, Sequence[object]]] = []
        for k in range(0, len(ids), 500):
            part = list(ids[k : k + 500])
            statements.append((f"DELETE FROM outbox WHERE id IN ({','.join('?' * len(part))})", part))
        statements.append(
            (
                "INSERT INTO outbox_meta (key, value) VALUES ('confirmed_seq', ?)"
                " ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (seq,),
            )
        )
        self._transaction(statements)
        self.confirmed_seq = seq
        self._forget(counted, size)
        if sync and self.fsync and self._wal is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, os.fsync, self._wal)

    async def set_confirmed(self, seq: int) -> None:
        """Record, durably, a stream position before which no event of this outbox can be (before its first
        publish): a restart that finds no position knows nothing was ever sent."""
        await self.remove([], seq, sync=True)

    def _forget(self, ids: Sequence[int], size: int) -> None:
        """Rows this process counted (``ids``, ``size`` bytes of them) have left the table."""
        self._untrack(ids)
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

    # --- per execution ------------------------------------------------------------------------------------

    def _track(self, row: int, execution_id: str | None) -> None:
        self._row_execution[row] = execution_id
        if execution_id is not None:
            self._execution_rows[execution_id] = self._execution_rows.get(execution_id, 0) + 1

    def _untrack(self, ids: Iterable[int]) -> None:
        for i in ids:
            eid = self._row_execution.pop(i, None)
            if eid is None:  # not counted here, or a row without an execution
                continue
            left = self._execution_rows[eid] - 1
            if left:
                self._execution_rows[eid] = left
                continue
            del self._execution_rows[eid]
            flushed = self._flushed.pop(eid, None)
            if flushed is not None:
                flushed.set()

    def _execution_row(self, execution_id: str) -> tuple[int, bool, int | None] | None:
        """``(calls, sealed, sealed_at)`` of the execution's row, None without one."""
        self._conn()  # as the query did: OutboxError when the outbox is not open
        return self._executions.get(execution_id)

    def _row(self, execution_id: str) -> tuple[int, bool] | None:
        row = self._execution_row(execution_id)
        return row[:2] if row is not None else None

    def _execution(self, execution_id: str) -> tuple[int, bool] | None:
        """``(calls, sealed)`` of the execution's row; for one without a row, its sealed finish in the log (a
        pruned seal); None when neither knows it."""
        row = self._row(execution_id)
        if row is not None:
            return row
        in_log = self.sealed_in_log(execution_id) if self.sealed_in_log is not None else None
        return (in_log, True) if in_log is not None else None

    def sealed(self, execution_id: str) -> bool:
        known = self._execution(execution_id)
        return known is not None and known[1]

    def calls(self, execution_id: str) -> int:
        """The execution's calls put here (over every run of this outbox), whether or not they left yet; for a
        pruned execution the count its finish in the log carries."""
        known = self._execution(execution_id)
        return known[0] if known is not None else 0

    def executions(self) -> int:
        """Rows of ``outbox_executions``: executions in progress, and sealed ones not pruned yet."""
        return int(self._conn().execute("SELECT count(*) FROM outbox_executions").fetchone()[0])

    def sealed_ids(self) -> list[str]:
        """Executions sealed here whose seal is not pruned yet."""
        return [str(r[0]) for r in self._conn().execute("SELECT execution_id FROM outbox_executions WHERE sealed = 1")]

    def prune(self, in_log: Iterable[str]) -> int:
        """Forget the seals of executions whose sealed finish the log holds (``in_log``, as ``sealed_in_log``
        knows them: it answers for them from now on, with the same count); how many rows left. An execution with a
        row still to drain keeps its seal here."""
        if self.sealed_in_log is None:
            return 0
        gone = [x for x in in_log if not self._execution_rows.get(x)]
        before = self.executions()
        for k in range(0, len(gone), 500):
            part = gone[k : k + 500]
            marks = ",".join("?" * len(part))
            self._transaction([(f"DELETE FROM outbox_executions WHERE sealed = 1 AND execution_id IN ({marks})", part)])
            for x in part:
                if (known := self._executions.get(x)) is not None and known[1]:
                    del self._executions[x]
        return before - self.executions()

    async def seal(self, execution_id: str) -> None:
        """Refuse the execution's calls from now on, durably (fsync'd before this returns). Idempotent."""
        in_log = self.sealed_in_log
        if self._row(execution_id) is None and in_log is not None:
            known = await asyncio.to_thread(in_log, execution_id)
            if known is not None:
                return  # sealed, and its seal is in the log already (pruned here)
        try:
            self._transaction(
                [
                    (
                        # sealed_at: the first row id after the seal (put() refuses the execution from now on).
                        "INSERT INTO outbox_executions (execution_id, calls, sealed, sealed_at) VALUES (?, 0, 1, ?)"
                        " ON CONFLICT (execution_id) DO UPDATE SET sealed = 1,"
                        " sealed_at = coalesce(sealed_at, excluded.sealed_at)",
                        (execution_id, self._next_id),
                    )
                ]
            )
            calls, _, sealed_at = self._executions.get(execution_id, (0, False, None))
            self._executions[execution_id] = (calls, True, self._next_id if sealed_at is None else sealed_at)
            if self.fsync and self._wal is not None:
                await asyncio.get_running_loop().run_in_executor(self._thread, os.fsync, self._wal)
        except Exception as exc:
            raise OutboxError(f"sealing execution {execution_id} failed: {exc}") from exc

    async def wait_flushed(self, execution_id: str) -> None:
        """Until none of the execution's rows is left (each is in the log, or quarantined)."""
        if not self._execution_rows.get(execution_id):
            return
        await self._flushed.setdefault(execution_id, asyncio.Event()).wait()


def _private_dir(d: Path) -> None:
    """The outbox's folder 0700: made so, or narrowed to it when this user owns it (others could otherwise list,
    replace or delete its files); one of another user's that others may write is logged."""
    d.mkdir(parents=True, exist_ok=True, mode=0o700)
    st = d.stat()
    if st.st_mode & 0o077 == 0:
        return
    if st.st_uid == os.geteuid():
        d.chmod(0o700)
    elif st.st_mode & 0o022:
        log.warning("the outbox's folder %s belongs to another user and others may write it", d)


def _private_file(f: Path) -> None:
    """A file of the outbox 0600 (one an older build made with the umask's mode is narrowed)."""
    with contextlib.suppress(FileNotFoundError):
        if f.stat().st_mode & 0o077:
            f.chmod(0o600)


def _checkpoint(path: str) -> None:
    """Copy the WAL into the database from a connection of this thread's own (it does not block the writer)."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        db.close()
