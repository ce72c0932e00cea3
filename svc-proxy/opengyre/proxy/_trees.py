"""Reading the trajectory store: trees, leaves, root-to-leaf token paths with their generated-token mask.

``load_tree(conn, execution_id)`` is what the trainer calls: it returns the shared
``opengyre.trajectory.TrajectoryTree`` built from the stored rows, identical to the one the live events build.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Row, select

from opengyre.events import CallTimings, DriftReport, ModelCallRecorded, ToolCallPayload, WeightSpan
from opengyre.trajectory import PathSequence, TrajectoryError, TrajectoryTree

from ._store import CALLS, EXECUTIONS, unpack_floats, unpack_ids

__all__ = [
    "ExecutionSummary",
    "StoredCall",
    "list_executions",
    "load_calls",
    "load_tree",
    "path_mask",
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


@dataclass(frozen=True, slots=True)
class StoredCall:
    """One stored call, as the event that recorded it (``seq`` is its position in the log)."""

    seq: int
    event: ModelCallRecorded


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
        output_logprobs=unpack_floats(r.output_logprobs),
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
        weight_versions=[WeightSpan(version=v, start=a, end=b) for v, a, b in json.loads(r.weight_versions)],
        temperature=r.temperature,
    )


def load_calls(conn: Connection, execution_id: str) -> list[StoredCall]:
    """The execution's calls in log order (parents before children)."""
    rows = conn.execute(select(CALLS).where(CALLS.c.execution_id == execution_id).order_by(CALLS.c.seq)).all()
    return [StoredCall(seq=r.seq, event=_event(r)) for r in rows]


def load_tree(conn: Connection, execution_id: str) -> TrajectoryTree:
    """The trajectory tree of one execution from the store (empty if nothing was recorded)."""
    tree = TrajectoryTree(execution_id)
    for c in load_calls(conn, execution_id):
        tree.add(c.event)
    return tree


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
        )
        for r in conn.execute(q).all()
    ]


def path_mask(tree: TrajectoryTree, leaf: str) -> PathSequence:
    """A root-to-leaf path as tokens with ``generated`` (the loss mask) and behaviour logprobs."""
    if leaf not in tree:
        raise TrajectoryError(f"no call {leaf} in the tree of {tree.execution_id}")
    return tree.path_sequence(leaf)
