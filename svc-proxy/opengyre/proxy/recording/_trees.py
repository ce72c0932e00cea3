"""Reading the trajectory store: trees, leaves, root-to-leaf token paths with their generated-token mask.

``await load_tree(db, log, execution_id)`` returns the shared ``opengyre.trajectory.TrajectoryTree`` built from
the stored rows and the payloads they refer to, identical to the one the live events build. ``load_calls`` gives
the rows as the events that recorded them (tokens still out of band); ``load_execution`` joins them back in.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, select

from opengyre.eventlog import EventLog
from opengyre.events import CallTimings, DriftReport, ModelCallRecorded, PayloadRef, ToolCallPayload, WeightSpan
from opengyre.trajectory import (
    PathSequence,
    PayloadUnavailable,
    TrajectoryError,
    TrajectoryTree,
    node_from_row,
    resolve_calls,
    unpack_ids,
    unpack_logprobs,
    unpack_spans,
)

from ._store import CALLS, EXECUTIONS

__all__ = [
    "ExecutionSummary",
    "StoredCall",
    "list_executions",
    "load_calls",
    "load_execution",
    "load_tree",
    "path_mask",
    "resolve_stored",
]


@dataclass(frozen=True, slots=True)
class ExecutionSummary:
    execution_id: str
    calls: int
    roots: int
    drift: int
    rerouted: int
    stored_tokens: int
    flat_tokens: int
    first_seq: int
    last_seq: int
    last_at: datetime
    payload_bytes: int = 0  # encoded token payloads its calls refer to
    compacted_seq: int | None = None  # the last compaction of its payloads (None: none)


@dataclass(frozen=True, slots=True)
class StoredCall:
    """One stored call, as the event that recorded it (``seq`` is its position in the log).

    ``compacted``: retention deleted its payload (the event's lengths and counts remain)."""

    seq: int
    event: ModelCallRecorded
    compacted: bool = False


def _event(r: Row[Any]) -> ModelCallRecorded:
    drift = None
    if r.drift_kind is not None:
        drift = DriftReport(kind=r.drift_kind, position=int(r.drift_position or 0), detail=r.drift_detail or "")
    at = r.occurred_at if r.occurred_at.tzinfo else r.occurred_at.replace(tzinfo=UTC)  # SQLite drops the zone
    return ModelCallRecorded(
        event_id=r.event_id,
        occurred_at=at,
        execution_id=r.execution_id,
        call_id=r.call_id,
        parent_call_id=r.parent_call_id,
        prefix_len=r.prefix_len,
        prompt_delta_ids=unpack_ids(r.prompt_delta),
        output_ids=unpack_ids(r.output_ids),
        output_logprobs=unpack_logprobs(r.output_logprobs),
        role=r.role,
        model=r.model,
        engine_id=r.engine_id,
        weight_version=r.weight_version,
        finish_reason=r.finish_reason,
        dialect=r.dialect,
        tool_calls=[ToolCallPayload(**t) for t in json.loads(r.tool_calls)],
        timings=CallTimings(queued_ms=r.queued_ms, ttft_ms=r.ttft_ms, total_ms=r.total_ms),
        drift=drift,
        context=json.loads(r.context) if r.context is not None else None,
        context_ref=r.context_ref,
        attempts=r.attempts,
        branch=r.branch,
        weight_versions=[WeightSpan(version=v, start=a, end=b) for v, a, b in unpack_spans(r.weight_versions)],
        temperature=r.temperature,
        payload=PayloadRef(
            digest=r.payload_digest, size=int(r.payload_size or 0), prompt_delta=r.n_prompt_delta, output=r.n_output
        )
        if r.payload_digest is not None
        else None,
    )


def load_calls(conn: Connection, execution_id: str) -> list[StoredCall]:
    """The execution's calls in log order (parents before children), as recorded: a call whose tokens are in
    the payload store has empty token lists and its ``payload`` reference (``load_execution`` joins them)."""
    rows = conn.execute(select(CALLS).where(CALLS.c.execution_id == execution_id).order_by(CALLS.c.seq)).all()
    return [StoredCall(seq=r.seq, event=_event(r), compacted=r.compacted_seq is not None) for r in rows]


async def resolve_stored(log: EventLog | None, calls: Sequence[StoredCall]) -> list[StoredCall]:
    """The calls with their payloads joined back in. Raises ``PayloadUnavailable``: ``payload-compacted`` for a
    call retention compacted, ``payload-missing`` / ``payload-corrupt`` for one the payload store cannot give."""
    for c in calls:
        if c.compacted:
            raise PayloadUnavailable(
                "payload-compacted",
                f"the payload of call {c.event.call_id} of {c.event.execution_id} was compacted (retention); "
                "its lengths and counts remain in the store",
            )
    if log is None:
        if any(c.event.payload is not None for c in calls):
            raise PayloadUnavailable("payload-missing", "no event log to read the calls' payloads from")
        return list(calls)
    events = await resolve_calls(log, [c.event for c in calls])
    return [replace(c, event=e) for c, e in zip(calls, events, strict=True)]


async def load_execution(db: Engine, log: EventLog | None, execution_id: str) -> list[StoredCall]:
    """The execution's calls in log order with their tokens, logprobs and context (see ``resolve_stored``)."""

    def q() -> list[StoredCall]:
        with db.connect() as conn:
            return load_calls(conn, execution_id)

    return await resolve_stored(log, await asyncio.to_thread(q))


async def load_tree(db: Engine, log: EventLog | None, execution_id: str) -> TrajectoryTree:
    """The trajectory tree of one execution from the store (empty if nothing was recorded): each row becomes
    a node through ``opengyre.trajectory.node_from_row``, as in the trainer's store. Raises ``PayloadUnavailable``
    as ``resolve_stored`` does."""

    def q() -> list[Row[Any]]:
        with db.connect() as conn:
            return list(
                conn.execute(select(CALLS).where(CALLS.c.execution_id == execution_id).order_by(CALLS.c.seq)).all()
            )

    rows = await asyncio.to_thread(q)
    keys = [(r.execution_id, r.payload_digest) for r in rows if r.payload_digest is not None]
    payloads = await log.payloads.get_many(keys) if log is not None and keys else None
    return TrajectoryTree(execution_id, [node_from_row(r, payloads, spans=r.weight_versions) for r in rows])


def list_executions(conn: Connection, execution_ids: Sequence[str] | None = None) -> list[ExecutionSummary]:
    q = select(EXECUTIONS).order_by(EXECUTIONS.c.first_seq)
    if execution_ids:
        q = q.where(EXECUTIONS.c.execution_id.in_(list(execution_ids)))
    return [
        ExecutionSummary(
            execution_id=r.execution_id,
            calls=r.calls,
            roots=r.roots,
            drift=r.drift,
            rerouted=r.rerouted,
            stored_tokens=r.stored_tokens,
            flat_tokens=r.flat_tokens,
            first_seq=r.first_seq,
            last_seq=r.last_seq,
            last_at=r.last_at,
            payload_bytes=r.payload_bytes,
            compacted_seq=r.compacted_seq,
        )
        for r in conn.execute(q).all()
    ]


def path_mask(tree: TrajectoryTree, leaf: str) -> PathSequence:
    """A root-to-leaf path as tokens with ``generated`` (the loss mask) and behaviour logprobs."""
    if leaf not in tree:
        raise TrajectoryError(f"no call {leaf} in the tree of {tree.execution_id}")
    return tree.path_sequence(leaf)
