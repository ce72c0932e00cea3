"""Read side of the trainer's projection: ready groups, outcomes, trajectory trees, version steps."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from sqlalchemy import Engine, Row, Table, func, select

from opengyre.eventlog import TRANSIENT_ERRORS, EventLog, PayloadFetch
from opengyre.retry import backoff
from opengyre.store import DeadLetter
from opengyre.trajectory import TrajectoryError, TrajectoryTree, node_from_row

from ._admission import ExecutionOutcome
from ._projection import TrainerProjection
from ._tables import CallRow, EngineRow, ExecutionRow, StepRow, WeightsRow

__all__ = ["AwaitingCalls", "ReadyGroup", "TrainerStore"]

_log = logging.getLogger(__name__)

_E = cast(Table, ExecutionRow.__table__)
_C = cast(Table, CallRow.__table__)
_S = cast(Table, StepRow.__table__)
_W = cast(Table, WeightsRow.__table__)
_N = cast(Table, EngineRow.__table__)


@dataclass(frozen=True)
class ReadyGroup:
    group_id: str
    task_id: str
    outcomes: tuple[ExecutionOutcome, ...]
    weight_versions: dict[str, str]  # execution -> the version it was dispatched with
    ready_seq: int  # the stream sequence at which its last member finished
    size: int = 0  # the dispatched group size (0: unknown, the member count applies)


@dataclass(frozen=True)
class AwaitingCalls:
    execution_id: str
    applied: int  # calls the trainer has
    recorded: int  # calls the proxy counted when it sealed the execution


class TrainerStore:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def ready_groups(self, default_group_size: int = 16, limit: int | None = None) -> list[ReadyGroup]:
        """Groups whose members have all been dispatched and finished, none consumed, none awaiting calls its
        finish counted (``awaiting_calls``); oldest-ready first."""
        with self.engine.connect() as c:
            rows = c.execute(select(_E).where(_E.c.consumed_step.is_(None)).order_by(_E.c.execution_id)).all()
        held = {a.execution_id for a in self._awaiting(rows)}
        by_group: dict[str, list[Row[Any]]] = defaultdict(list)
        for r in rows:
            by_group[r.group_id].append(r)
        ready: list[ReadyGroup] = []
        for gid, members in by_group.items():
            size = max((m.group_size for m in members), default=0) or default_group_size
            if len(members) < size or any(m.status == "running" or m.execution_id in held for m in members):
                continue
            ready.append(
                ReadyGroup(
                    group_id=gid,
                    task_id=members[0].task_id,
                    outcomes=tuple(
                        ExecutionOutcome(m.execution_id, gid, m.status, m.score, m.failure_class) for m in members
                    ),
                    weight_versions={m.execution_id: m.weight_version for m in members},
                    ready_seq=max(m.finished_seq or 0 for m in members),
                    size=size,
                )
            )
        ready.sort(key=lambda g: (g.ready_seq, g.group_id))
        return ready[:limit] if limit is not None else ready

    def awaiting_calls(self) -> list[AwaitingCalls]:
        """Finished, unconsumed executions whose finish counted more calls than the trainer has applied: held out
        of sampling (never trained as a partial tree) until the rest arrive. One with a rejected event is not
        held: the step drops it as corrupt."""
        with self.engine.connect() as c:
            rows = c.execute(
                select(_E).where(
                    _E.c.consumed_step.is_(None), _E.c.recorded_calls.is_not(None), _E.c.status != "running"
                )
            ).all()
        return self._awaiting(rows)

    def _awaiting(self, rows: Sequence[Row[Any]]) -> list[AwaitingCalls]:
        short = [
            r for r in rows if r.status != "running" and r.recorded_calls is not None and r.n_calls < r.recorded_calls
        ]
        corrupt = self.corrupt([r.execution_id for r in short]) if short else {}
        return [
            AwaitingCalls(r.execution_id, r.n_calls, r.recorded_calls) for r in short if r.execution_id not in corrupt
        ]

    def payload_keys(self, execution_ids: Sequence[str]) -> list[tuple[str, str]]:
        """``(execution, digest)`` of the payloads the executions' calls refer to (not compacted ones)."""
        with self.engine.connect() as c:
            rows = c.execute(
                select(_C.c.execution_id, _C.c.payload_digest)
                .where(
                    _C.c.execution_id.in_(list(execution_ids)),
                    _C.c.payload_digest.is_not(None),
                    _C.c.compacted_seq.is_(None),
                )
                .order_by(_C.c.execution_id, _C.c.ordinal)
            ).all()
        return [(r.execution_id, r.payload_digest) for r in rows]

    async def fetch_payloads(
        self, log: EventLog | None, execution_ids: Sequence[str], stop: asyncio.Event | None = None
    ) -> PayloadFetch:
        """Read the payloads of the executions' calls (the tokens a step trains on) from the payload store.

        A log that does not answer (a restarting server) is waited out with a capped backoff, until ``stop``:
        nothing is consumed before the payloads are read, so waiting loses nothing."""
        keys = await asyncio.to_thread(self.payload_keys, execution_ids)
        if log is None or not keys:
            return PayloadFetch(failed=dict.fromkeys(keys, "payload-missing"))

        async for attempt in backoff(
            "trainer: reading token payloads: the log does not answer", first_s=0.2, max_s=10.0,
            retry_on=TRANSIENT_ERRORS, until=lambda: stop is not None and stop.is_set(), logger=_log,
        ):  # fmt: skip
            with attempt:
                return await log.payloads.get_many(keys)
        raise AssertionError("unreachable: AsyncRetrying returns or raises")

    def tree(self, execution_id: str, payloads: PayloadFetch | None = None) -> TrajectoryTree:
        """The execution's trajectory tree, nodes in arrival order, from its rows and (for calls stored by
        reference) ``payloads`` (``fetch_payloads``). Raises TrajectoryError when inconsistent, and its
        subclass PayloadUnavailable (``payload-missing``, ``payload-compacted``, ``payload-corrupt``) when a
        call's recorded tokens cannot be had: never a guess in their place."""
        with self.engine.connect() as c:
            calls = c.execute(select(_C).where(_C.c.execution_id == execution_id).order_by(_C.c.ordinal)).all()
        tree = TrajectoryTree(execution_id)
        for r in calls:
            tree.add(node_from_row(r, payloads, spans=r.weight_spans))
        if not calls:
            raise TrajectoryError(f"execution {execution_id} has no recorded calls")
        return tree

    def corrupt(self, execution_ids: list[str]) -> dict[str, str]:
        """Executions with a dead-lettered event (a rejected call or finish): id -> the first reason; and those with
        more calls applied than the proxy counted when it sealed them (``calls-exceed-recorded``: the tree is not
        the one the finish describes)."""
        wanted = set(execution_ids)
        out: dict[str, str] = {}
        with self.engine.connect() as c:
            dead = c.execute(
                select(DeadLetter.subject, DeadLetter.reason)
                .where(DeadLetter.projection == TrainerProjection.name, DeadLetter.subject.like("%.execution.%"))
                .order_by(DeadLetter.stream_seq)
            ).all()
            over = c.execute(
                select(_E.c.execution_id).where(
                    _E.c.execution_id.in_(list(wanted)),
                    _E.c.recorded_calls.is_not(None),
                    _E.c.n_calls > _E.c.recorded_calls,
                )
            ).all()
        for subject, reason in dead:
            # <prefix>.execution.<id>, with .<event type> after it since subjects are per type there
            tokens = subject.split(".")
            at = len(tokens) - 1 - tokens[::-1].index("execution")
            eid = tokens[at + 1]
            if eid in wanted and eid not in out:
                out[eid] = reason
        for r in over:
            out.setdefault(r.execution_id, "calls-exceed-recorded")
        return out

    def version_steps(self, run_id: str = "default") -> dict[str, int]:
        with self.engine.connect() as c:
            return {r.weight_version: r.step for r in c.execute(select(_W).where(_W.c.run_id == run_id))}

    def weights(self, run_id: str = "default") -> list[Row[Any]]:
        with self.engine.connect() as c:
            return list(c.execute(select(_W).where(_W.c.run_id == run_id).order_by(_W.c.step, _W.c.seq)).all())

    def served_after(self, execution_ids: list[str], since: dict[str, int]) -> dict[str, str]:
        """Executions with a call that an engine in ``since`` (engine id -> log position) took part in after that
        position: execution -> the engine. A rerouted call names every engine it ran on."""
        if not since or not execution_ids:
            return {}
        with self.engine.connect() as c:
            rows = c.execute(
                select(_C.c.execution_id, _C.c.engine_id, _C.c.seq)
                .where(_C.c.execution_id.in_(execution_ids))
                .order_by(_C.c.seq)
            ).all()
        out: dict[str, str] = {}
        for r in rows:
            for engine in str(r.engine_id).split(","):
                if engine in since and r.seq > since[engine] and r.execution_id not in out:
                    out[r.execution_id] = engine
        return out

    def engine_ids(self) -> dict[str, list[str]]:
        """Engine URL -> the cells (the proxy's engine ids for cell engines) that announced it."""
        with self.engine.connect() as c:
            rows = c.execute(select(_N.c.cell_id, _N.c.engine_url).where(_N.c.engine_url.is_not(None))).all()
        out: dict[str, list[str]] = {}
        for r in rows:
            out.setdefault(str(r.engine_url), []).append(str(r.cell_id))
        return out

    def rollout_engines(self) -> list[str]:
        """Engine URLs of the cells now in the rollout role (they serve the policy and must follow it)."""
        with self.engine.connect() as c:
            rows = c.execute(
                select(_N.c.engine_url)
                .where(_N.c.role == "rollout", _N.c.engine_url.is_not(None))
                .order_by(_N.c.cell_id)
            ).all()
        return sorted({str(r.engine_url) for r in rows})

    def cell_roles(self) -> dict[str, str]:
        """Cell id -> its role, as the log's cell events made it (the cell aggregate's rule)."""
        with self.engine.connect() as c:
            rows = c.execute(select(_N.c.cell_id, _N.c.role)).all()
        return {str(r.cell_id): str(r.role) for r in rows}

    def latest_weights(self, run_id: str = "default") -> Row[Any] | None:
        with self.engine.connect() as c:
            return c.execute(
                select(_W).where(_W.c.run_id == run_id).order_by(_W.c.step.desc(), _W.c.seq.desc()).limit(1)
            ).first()

    def last_step_row(self, run_id: str = "default") -> Row[Any] | None:
        with self.engine.connect() as c:
            return c.execute(select(_S).where(_S.c.run_id == run_id).order_by(_S.c.step.desc()).limit(1)).first()

    def last_step(self, run_id: str = "default") -> int:
        with self.engine.connect() as c:
            v = c.execute(select(func.max(_S.c.step)).where(_S.c.run_id == run_id)).scalar()
        return int(v or 0)

    def steps(self, run_id: str = "default") -> list[dict[str, Any]]:
        with self.engine.connect() as c:
            return [dict(r._mapping) for r in c.execute(select(_S).where(_S.c.run_id == run_id).order_by(_S.c.step))]

    def execution(self, execution_id: str) -> dict[str, Any] | None:
        with self.engine.connect() as c:
            r = c.execute(select(_E).where(_E.c.execution_id == execution_id)).first()
        return dict(r._mapping) if r is not None else None
