"""One rule for a cell: every fold of cell events (the scheduler's state and SQL projection, the trainer's
projection, the proxy's watcher, the report) takes the same event sequences to the same cells and refuses the
same events as the pure ``evolve_cell`` does."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine, select

from opengyre.aggregates import Cell, CellEvent, evolve_cell
from opengyre.eventlog import EventLog
from opengyre.events import CellEngineChanged, CellRegistered, CellRoleChanged
from opengyre.projection import Projection, Rejected
from opengyre.proxy import EnginePool
from opengyre.report import FOLDED_TYPES, RunFold
from opengyre.scheduler import SchedulerProjection, SchedulerState, load_state
from opengyre.trainer import TrainerProjection

from ._reference import fold_reference

# Engine URLs nothing listens on: the proxy's pool adds a client without connecting.
A, B, C = "http://127.0.0.1:9/a", "http://127.0.0.1:9/b", "http://127.0.0.1:9/c"


def _rc(cell: str, frm: str, to: str, url: str | None = None) -> CellRoleChanged:
    return CellRoleChanged(cell_id=cell, from_role=frm, to_role=to, engine_url=url)  # type: ignore[arg-type]


SEQUENCES: dict[str, list[CellEvent]] = {
    "to-training-and-back": [
        CellRegistered(cell_id="c1", role="rollout", engine_url=A),
        CellRegistered(cell_id="c2", role="rollout", engine_url=B, resident=True),
        _rc("c1", "rollout", "draining"),
        _rc("c1", "draining", "switching"),
        _rc("c1", "switching", "training-core"),
        CellEngineChanged(cell_id="c2", engine_url=C),
        _rc("c1", "training-core", "switching"),
        _rc("c1", "switching", "rollout", url=B),
    ],
    "re-registration": [
        CellRegistered(cell_id="c1", role="rollout", engine_url=A),
        CellRegistered(cell_id="c1", role="idle", engine_url=B),  # refused: the first registration stands
        _rc("c1", "rollout", "draining"),
    ],
    "refusals": [
        CellRegistered(cell_id="r", role="rollout", engine_url=A, resident=True),
        CellRegistered(cell_id="neg", role="rollout", capacity=-1),
        _rc("ghost", "idle", "rollout"),
        CellEngineChanged(cell_id="ghost", engine_url=B),
        _rc("r", "idle", "rollout"),  # not the role it holds
        _rc("r", "rollout", "training-core"),  # not a step of the protocol
        _rc("r", "rollout", "draining"),
        _rc("r", "draining", "switching"),
        _rc("r", "switching", "training-core"),  # a resident cell never trains
        _rc("r", "switching", "rollout", url=C),
    ],
}


@dataclass(frozen=True)
class Parts:
    """The real parts a fold needs: a migrated database, a log (the watcher's, which ``apply`` never reads)."""

    engine: Engine
    event_log: EventLog


@dataclass(frozen=True)
class Outcome:
    roles: dict[str, str]
    urls: dict[str, str | None] | None  # None: the fold keeps no engine URLs
    refused: list[int]  # the seqs refused, among the events the fold reads


def reference(events: Sequence[CellEvent]) -> tuple[dict[str, Cell], list[int]]:
    ref = fold_reference(evolve_cell, lambda e: e.cell_id, events)
    return ref.views, ref.refused


Fold = Callable[[Sequence[CellEvent], Parts], Awaitable[Outcome]]


async def scheduler_state(events: Sequence[CellEvent], parts: Parts) -> Outcome:
    st, refused = SchedulerState(), []
    for seq, e in enumerate(events, 1):
        try:
            st.apply(e, seq)
        except Rejected:
            refused.append(seq)
    return Outcome(
        {c.cell_id: c.role for c in st.cells.values()}, {c.cell_id: c.engine_url for c in st.cells.values()}, refused
    )


def _sql(projection: Projection, events: Sequence[CellEvent], engine: Engine) -> list[int]:
    refused = []
    for seq, e in enumerate(events, 1):
        try:
            with engine.begin() as tx:  # a refused event rolls its transaction back, as the runner's does
                projection.apply(tx, e, seq)
        except Rejected:
            refused.append(seq)
    return refused


async def scheduler_sql(events: Sequence[CellEvent], parts: Parts) -> Outcome:
    engine = parts.engine
    refused = _sql(SchedulerProjection(), events, engine)
    with engine.connect() as conn:
        st = load_state(conn)
    return Outcome(
        {c.cell_id: c.role for c in st.cells.values()}, {c.cell_id: c.engine_url for c in st.cells.values()}, refused
    )


async def trainer_sql(events: Sequence[CellEvent], parts: Parts) -> Outcome:
    engine = parts.engine
    projection = TrainerProjection()
    refused = _sql(projection, events, engine)
    (table,) = [t for t in projection.tables if t.name == "trainer_engines"]
    with engine.connect() as conn:
        rows = conn.execute(select(table.c.cell_id, table.c.role, table.c.engine_url)).all()
    return Outcome({r.cell_id: r.role for r in rows}, {r.cell_id: r.engine_url for r in rows}, refused)


async def proxy_watcher(events: Sequence[CellEvent], parts: Parts) -> Outcome:
    # the watcher is the proxy's own; its fold is what is compared
    from opengyre.proxy.engines._cells import CellWatcher

    event_log = parts.event_log
    pool = EnginePool()
    try:
        watcher, refused = CellWatcher(event_log, pool), []
        for seq, e in enumerate(events, 1):
            before = watcher.applied
            await watcher.apply(e, seq)
            if watcher.applied == before:
                refused.append(seq)
        return Outcome(dict(watcher.roles), {c.cell_id: c.engine_url for c in watcher.cells.values()}, refused)
    finally:
        await pool.close()


async def report(events: Sequence[CellEvent], parts: Parts) -> Outcome:
    fold, refused = RunFold(), []
    for seq, e in enumerate(events, 1):
        if type(e) not in FOLDED_TYPES:
            continue
        before = sum(fold.anomalies.values())
        fold.apply(seq, e)
        if sum(fold.anomalies.values()) != before:
            refused.append(seq)
    return Outcome({c.cell_id: c.role for c in fold.summary().cells}, None, refused)


FOLDS: dict[str, Fold] = {
    "scheduler-state": scheduler_state,
    "scheduler-sql": scheduler_sql,
    "trainer-sql": trainer_sql,
    "proxy-watcher": proxy_watcher,
    "report": report,
}
READS: dict[str, tuple[type, ...]] = {"report": FOLDED_TYPES}


@pytest.mark.parametrize("sequence", list(SEQUENCES))
@pytest.mark.parametrize("fold", list(FOLDS))
async def test_every_fold_of_cell_events_agrees_with_the_cell_aggregate(
    fold: str, sequence: str, engine: Engine, event_log: EventLog
) -> None:
    events = SEQUENCES[sequence]
    cells, refused = reference(events)
    got = await FOLDS[fold](events, Parts(engine, event_log))
    reads = READS.get(fold)
    assert got.refused == [s for s in refused if reads is None or type(events[s - 1]) in reads]
    assert got.roles == {k: c.role for k, c in cells.items()}
    if got.urls is not None:
        assert got.urls == {k: c.engine_url for k, c in cells.items()}


def test_the_sequences_exercise_every_refusal() -> None:
    """The contract is only as strong as its sequences: each of the rule's refusals appears in one."""
    reasons = set()
    for events in SEQUENCES.values():
        reasons |= fold_reference(evolve_cell, lambda e: e.cell_id, events).reasons
    assert reasons == {
        "duplicate-cell", "invalid-cell", "unknown-cell", "wrong-role", "illegal-transition", "resident-never-trains"
    }  # fmt: skip
