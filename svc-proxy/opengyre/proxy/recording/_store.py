"""The trajectory store: a projection of model-call-recorded events into per-call rows.

A call recorded with its tokens out of band (``ModelCallRecorded.payload``, what the gateway writes) keeps
the reference and the lengths only: the tokens, logprobs and context are stored once, in the payload stream,
and read back by digest (``_trees.load_execution``). An inline call (v1 events, tools, tests) keeps exactly
what the event carried, packed by the shared codec (``opengyre.trajectory``: int32 ids, float32 logprobs)
after the shared rules (``check_call``) accepted it. ``payloads-compacted`` marks an execution's calls
whose payloads retention deleted; their lengths and counts stay. A rebuild from the log gives the same bytes.
``proxy_executions`` keeps per-execution counters; ``proxy_sealed`` the executions whose ``execution-finished``
carries the proxy's count of recorded calls (they were sealed): the seal is in the log, so the proxy's outbox may
forget it and still refuse the execution's calls (``_outbox``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import (
    Connection,
    DateTime,
    Engine,
    Float,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
    insert,
    select,
    update,
)
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.events import ExecutionFinished, ModelCallRecorded, PayloadsCompacted
from opengyre.projection import Projection, Rejected, folds
from opengyre.store import STREAM_SEQ, Base
from opengyre.trajectory import (
    CALLS_TABLE,
    ENGINE_ID_LEN,
    EXECUTIONS_TABLE,
    FINISH_REASON_LEN,
    CallRejected,
    call_row,
    check_call,
)

__all__ = [
    "CALLS",
    "EXECUTIONS",
    "SEALED",
    "CallRow",
    "ExecutionRow",
    "SealedFinishes",
    "SealedRow",
    "TrajectoryProjection",
]


class CallRow(Base):
    __tablename__ = CALLS_TABLE  # execution_sizes (opengyre.trajectory) reads it by this name

    execution_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    call_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    seq: Mapped[int] = mapped_column(STREAM_SEQ, index=True)
    event_id: Mapped[str] = mapped_column(String(64))
    parent_call_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    prefix_len: Mapped[int] = mapped_column(Integer)
    n_tokens: Mapped[int] = mapped_column(Integer)  # prompt + output length
    n_prompt_delta: Mapped[int] = mapped_column(Integer)
    n_output: Mapped[int] = mapped_column(Integer)
    # Inline calls only (empty when the tokens are in the payload store):
    prompt_delta: Mapped[bytes] = mapped_column(LargeBinary)
    output_ids: Mapped[bytes] = mapped_column(LargeBinary)
    output_logprobs: Mapped[bytes] = mapped_column(LargeBinary)
    # The payload's digest and size (None: inline), and the compaction that deleted it (None: still there).
    payload_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    payload_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    compacted_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)
    role: Mapped[str] = mapped_column(String(32))
    model: Mapped[str] = mapped_column(String(128))
    engine_id: Mapped[str] = mapped_column(String(ENGINE_ID_LEN))
    weight_version: Mapped[str] = mapped_column(String(64))
    finish_reason: Mapped[str] = mapped_column(String(FINISH_REASON_LEN))
    dialect: Mapped[str] = mapped_column(String(32))
    branch: Mapped[str] = mapped_column(String(16))
    tool_calls: Mapped[str] = mapped_column(Text)
    queued_ms: Mapped[float] = mapped_column(Float)
    ttft_ms: Mapped[float] = mapped_column(Float)
    total_ms: Mapped[float] = mapped_column(Float)
    drift_kind: Mapped[str | None] = mapped_column(String(32), nullable=True)
    drift_position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    drift_detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    context: Mapped[str | None] = mapped_column(Text, nullable=True)
    context_ref: Mapped[str | None] = mapped_column(String(255), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer)
    occurred_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    weight_versions: Mapped[str] = mapped_column(Text, server_default="[]")  # [[version, start, end], ...]
    temperature: Mapped[float | None] = mapped_column(Float, nullable=True)  # of the logprobs; None: unknown


class ExecutionRow(Base):
    __tablename__ = EXECUTIONS_TABLE

    execution_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    calls: Mapped[int] = mapped_column(Integer)
    roots: Mapped[int] = mapped_column(Integer)
    drift: Mapped[int] = mapped_column(Integer)
    rerouted: Mapped[int] = mapped_column(Integer)
    stored_tokens: Mapped[int] = mapped_column(STREAM_SEQ)  # deltas + outputs: what the tree keeps
    flat_tokens: Mapped[int] = mapped_column(STREAM_SEQ)  # every call's prompt + output: what flat storage keeps
    first_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    last_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    last_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    payload_bytes: Mapped[int] = mapped_column(STREAM_SEQ, server_default="0")  # encoded payloads referenced
    compacted_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)  # last compaction


class SealedRow(Base):
    __tablename__ = "proxy_sealed"

    execution_id: Mapped[str] = mapped_column(String(200), primary_key=True)
    recorded_calls: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(STREAM_SEQ, index=True)


CALLS: Table = CallRow.__table__  # type: ignore[assignment]
EXECUTIONS: Table = ExecutionRow.__table__  # type: ignore[assignment]
SEALED: Table = SealedRow.__table__  # type: ignore[assignment]


class TrajectoryProjection(Projection):
    name = "trajectories"
    aggregates = ("execution",)

    @property
    def tables(self) -> Sequence[Table]:
        return (CALLS, EXECUTIONS, SEALED)

    @folds(ExecutionFinished)
    def _finished(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        # Only a sealed finish (it carries the count): an unsealed execution keeps taking calls (docs/trainer.md).
        if e.recorded_calls is None:
            return
        if tx.execute(select(SEALED.c.execution_id).where(SEALED.c.execution_id == e.execution_id)).first():
            raise Rejected(f"{e.execution_id} finished twice")
        tx.execute(insert(SEALED).values(execution_id=e.execution_id, recorded_calls=e.recorded_calls, seq=seq))

    @folds(PayloadsCompacted)
    def _compacted(self, tx: Connection, e: PayloadsCompacted, seq: int) -> None:
        if (
            tx.execute(select(EXECUTIONS.c.execution_id).where(EXECUTIONS.c.execution_id == e.execution_id)).first()
            is None
        ):
            raise Rejected(f"payloads of unknown execution {e.execution_id} compacted")
        tx.execute(
            update(CALLS)
            .where(
                CALLS.c.execution_id == e.execution_id,
                CALLS.c.payload_digest.is_not(None),
                CALLS.c.compacted_seq.is_(None),
                CALLS.c.seq < seq,
            )
            .values(compacted_seq=seq)
        )
        tx.execute(update(EXECUTIONS).where(EXECUTIONS.c.execution_id == e.execution_id).values(compacted_seq=seq))

    @folds(ModelCallRecorded)
    def _call(self, tx: Connection, e: ModelCallRecorded, seq: int) -> None:
        # The call itself and its parent: what the shared rules need to know of the execution's calls.
        known = tx.execute(
            select(CALLS.c.call_id, CALLS.c.n_tokens).where(
                CALLS.c.execution_id == e.execution_id, CALLS.c.call_id.in_([e.call_id, e.parent_call_id or e.call_id])
            )
        ).all()
        try:
            check_call(e, known={r.call_id: r.n_tokens for r in known})
        except CallRejected as exc:
            raise Rejected(str(exc), reason=exc.reason) from exc
        row = call_row(e, seq)
        row["weight_versions"] = row.pop("weight_spans")  # this store's name for the column
        ref, n_tokens, d = e.payload, row["n_tokens"], e.drift
        tx.execute(
            insert(CALLS).values(
                **row,
                event_id=e.event_id,
                model=e.model,
                dialect=e.dialect,
                branch=e.branch,
                tool_calls=json.dumps([{"id": t.id, "name": t.name, "arguments": t.arguments} for t in e.tool_calls]),
                queued_ms=e.timings.queued_ms,
                ttft_ms=e.timings.ttft_ms,
                total_ms=e.timings.total_ms,
                drift_kind=d.kind if d else None,
                drift_position=d.position if d else None,
                drift_detail=d.detail if d else None,
                context=json.dumps(e.context, sort_keys=True) if e.context is not None else None,
                context_ref=e.context_ref,
                attempts=e.attempts,
                occurred_at=e.occurred_at,
            )
        )
        stored = e.n_prompt_delta + e.n_output
        size = ref.size if ref else 0
        ex = tx.execute(select(EXECUTIONS).where(EXECUTIONS.c.execution_id == e.execution_id)).first()
        if ex is None:
            tx.execute(
                insert(EXECUTIONS).values(
                    execution_id=e.execution_id,
                    calls=1,
                    roots=1 if e.parent_call_id is None else 0,
                    drift=1 if d else 0,
                    rerouted=e.attempts - 1,
                    stored_tokens=stored,
                    flat_tokens=n_tokens,
                    first_seq=seq,
                    last_seq=seq,
                    last_at=e.occurred_at,
                    payload_bytes=size,
                    compacted_seq=None,
                )
            )
            return
        tx.execute(
            update(EXECUTIONS)
            .where(EXECUTIONS.c.execution_id == e.execution_id)
            .values(
                calls=ex.calls + 1,
                roots=ex.roots + (1 if e.parent_call_id is None else 0),
                drift=ex.drift + (1 if d else 0),
                rerouted=ex.rerouted + e.attempts - 1,
                stored_tokens=ex.stored_tokens + stored,
                flat_tokens=ex.flat_tokens + n_tokens,
                last_seq=seq,
                last_at=e.occurred_at,
                payload_bytes=ex.payload_bytes + size,
            )
        )


class SealedFinishes:
    """The executions whose sealed finish the log holds, as this store has folded them (``proxy_sealed``)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def count(self, execution_id: str) -> int | None:
        """The recorded calls its finish carries; None when the store has no sealed finish of it."""
        with self.engine.connect() as c:
            row = c.execute(select(SEALED.c.recorded_calls).where(SEALED.c.execution_id == execution_id)).first()
        return int(row[0]) if row is not None else None

    def which(self, execution_ids: Sequence[str]) -> set[str]:
        """Those of ``execution_ids`` with a sealed finish here."""
        out: set[str] = set()
        with self.engine.connect() as c:
            for k in range(0, len(execution_ids), 500):
                part = list(execution_ids[k : k + 500])
                out |= {r[0] for r in c.execute(select(SEALED.c.execution_id).where(SEALED.c.execution_id.in_(part)))}
        return out
