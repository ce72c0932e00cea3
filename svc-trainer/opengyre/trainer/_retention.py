"""Retention: delete the token payloads of executions a step consumed once the run is past the replay horizon.

What may go is decided from the log alone, as the trainer's projection folded it: an execution a
``training-step-completed`` consumed (trained or dropped) at step ``s`` of a run whose latest step is at least
``s + retain_steps``. Nothing a step has not consumed is ever deleted. For each such execution the compactor
purges its payloads (only those stored before it decided), then appends ``payloads-compacted``; projections
keep every count and length and mark the calls compacted. If it dies between the purge and the append, the
execution is still a candidate and the next round purges (nothing left) and appends; readers in between get
``payload-missing`` for an execution no step will read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import cast

from sqlalchemy import Table, func, select

from opengyre.eventlog import EventLog
from opengyre.events import PayloadsCompacted

from ._store import TrainerStore
from ._tables import CallRow, ExecutionRow, StepRow

__all__ = ["Compactable", "RetentionPolicy", "compact", "compactable", "retention_loop"]

log = logging.getLogger(__name__)

_E = cast(Table, ExecutionRow.__table__)
_C = cast(Table, CallRow.__table__)
_S = cast(Table, StepRow.__table__)

DEFAULT_RETAIN_STEPS = 4


@dataclass(frozen=True)
class RetentionPolicy:
    """``retain_steps``: steps a consumed execution's payloads outlive its step (the replay horizon); None keeps
    every payload. ``interval_s``: how often the trainer service looks for what may go."""

    retain_steps: int | None = DEFAULT_RETAIN_STEPS
    interval_s: float = 10.0

    def __post_init__(self) -> None:
        if self.retain_steps is not None and self.retain_steps < 0:
            raise ValueError(f"retain_steps must be >= 0 (or None: keep everything), not {self.retain_steps}")
        if not self.interval_s > 0:
            raise ValueError(f"the retention interval must be > 0 seconds, not {self.interval_s}")

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetentionPolicy:
        """``OPENGYRE_RETAIN_STEPS`` (an integer >= 0, or ``keep`` to never compact; default 4) and
        ``OPENGYRE_RETENTION_INTERVAL_S`` (default 10)."""
        env = os.environ if env is None else env
        raw = env.get("OPENGYRE_RETAIN_STEPS", "").strip()
        interval = env.get("OPENGYRE_RETENTION_INTERVAL_S", "").strip()
        try:
            steps = None if raw == "keep" else int(raw) if raw else DEFAULT_RETAIN_STEPS
            return cls(steps, float(interval) if interval else 10.0)
        except ValueError as exc:
            raise ValueError(f"retention settings: {exc} (OPENGYRE_RETAIN_STEPS is an integer >= 0 or 'keep')") from exc


@dataclass(frozen=True)
class Compactable:
    execution_id: str
    run_id: str
    step: int  # the step that consumed it
    last_step: int  # the run's latest step now
    calls: int  # calls whose payload is still stored
    bytes: int
    through_seq: int  # the last of those calls' stream sequence


def compactable(store: TrainerStore, policy: RetentionPolicy, limit: int = 1000) -> list[Compactable]:
    """Consumed executions past the replay horizon that still have payloads, oldest step first."""
    if policy.retain_steps is None:
        return []
    stored = (
        select(
            _C.c.execution_id,
            func.count().label("calls"),
            func.coalesce(func.sum(_C.c.payload_size), 0).label("bytes"),
            func.max(_C.c.seq).label("through_seq"),
        )
        .where(_C.c.payload_digest.is_not(None), _C.c.compacted_seq.is_(None))
        .group_by(_C.c.execution_id)
        .subquery()
    )
    last = select(_S.c.run_id, func.max(_S.c.step).label("last_step")).group_by(_S.c.run_id).subquery()
    q = (
        select(
            _E.c.execution_id,
            _E.c.consumed_run,
            _E.c.consumed_step,
            last.c.last_step,
            stored.c.calls,
            stored.c.bytes,
            stored.c.through_seq,
        )
        .join(stored, stored.c.execution_id == _E.c.execution_id)
        .join(last, last.c.run_id == _E.c.consumed_run)
        .where(_E.c.consumed_step.is_not(None), _E.c.consumed_step <= last.c.last_step - policy.retain_steps)
        .order_by(_E.c.consumed_step, _E.c.execution_id)
        .limit(limit)
    )
    with store.engine.connect() as c:
        return [
            Compactable(
                r.execution_id, r.consumed_run, int(r.consumed_step), int(r.last_step), r.calls, r.bytes, r.through_seq
            )
            for r in c.execute(q)
        ]


async def compact(store: TrainerStore, log_: EventLog, policy: RetentionPolicy) -> list[PayloadsCompacted]:
    """One round: purge and announce every execution ``compactable`` gives now. Returns the events appended."""
    out: list[PayloadsCompacted] = []
    for c in await asyncio.to_thread(compactable, store, policy):
        mark = await log_.payloads.last_seq()  # payloads stored after this (a late call) are kept
        await log_.payloads.purge(c.execution_id, below_seq=mark + 1)
        event = PayloadsCompacted(
            # The same candidate gets the same id: a round repeated before the projection folded it is stored once.
            event_id=f"payloads-compacted-{c.execution_id}-{c.through_seq}",
            execution_id=c.execution_id,
            run_id=c.run_id,
            step=c.step,
            calls=c.calls,
            bytes=c.bytes,
            reason=f"consumed by step {c.step}; the run is at step {c.last_step}, retain {policy.retain_steps}",
        )
        await log_.append(event)
        out.append(event)
    if out:
        log.info("retention: compacted the payloads of %d executions (%d bytes)", len(out), sum(e.bytes for e in out))
    return out


async def retention_loop(store: TrainerStore, log_: EventLog, policy: RetentionPolicy, stop: asyncio.Event) -> None:
    """Compact every ``interval_s`` until ``stop``; a failed round is logged and retried on the next."""
    if policy.retain_steps is None:
        return
    while not stop.is_set():
        try:
            await compact(store, log_, policy)
        except Exception:
            log.exception("retention: a compaction round failed; retrying in %.0f s", policy.interval_s)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), policy.interval_s)
