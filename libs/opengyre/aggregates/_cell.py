"""The cell aggregate: ``cell-registered``, ``cell-role-changed`` and ``cell-engine-changed`` folded into a
:class:`Cell` by one rule.

The rule is the owner's (the catalogue makes the scheduler the cell's only writer; its commands append a cell
event only when this fold accepts it), and every reader applies it unchanged:

- a cell registers once: a second ``cell-registered`` for the same id is refused (``duplicate-cell``), so its
  registration order, node, GPUs, capacity and residency never change after the first; negative capacity or GPUs
  are refused (``invalid-cell``);
- a role change names the role the cell holds (``wrong-role``), is a step of the role-change protocol
  (:data:`TRANSITIONS`, ``illegal-transition``), and never takes a resident cell to training
  (``resident-never-trains``); one that names an engine re-points the cell, one that names none keeps it;
- an engine change re-points the cell without changing its role;
- any event of an unregistered cell is refused (``unknown-cell``).

A refused event raises :class:`~opengyre.projection.Rejected` with that reason and leaves the cell as it was:
the SQL projections dead-letter it, the proxy logs and skips it, the report counts it as an anomaly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from opengyre.events import CellEngineChanged, CellRegistered, CellRole, CellRoleChanged, Event
from opengyre.projection import Rejected

__all__ = [
    "CELL_EVENTS",
    "ROLLOUT_ROLES",
    "TRAINING_ROLES",
    "TRANSITIONS",
    "Cell",
    "CellEvent",
    "cell_key",
    "check_transition",
    "evolve_cell",
]

TRAINING_ROLES: frozenset[CellRole] = frozenset({"training-core", "training-satellite"})
# Only a cell in "rollout" serves executions; a draining cell is leaving and counts for nothing.
ROLLOUT_ROLES: frozenset[CellRole] = frozenset({"rollout"})

# The role-change protocol as a graph. To training: rollout -> draining (stop routing, reroute in-flight)
# -> switching (engine released, trainer starting) -> training-core | training-satellite. Back: training-*
# -> switching (trainer stopped) -> rollout. "idle" is a cell that serves nothing (registered, failed, parked).
# A draining cell may go back to rollout (the drain was cancelled); a satellite is promoted when the core leaves.
TRANSITIONS: Mapping[CellRole, frozenset[CellRole]] = {
    "idle": frozenset({"rollout", "switching"}),
    "rollout": frozenset({"draining", "idle"}),
    "draining": frozenset({"switching", "rollout", "idle"}),
    "switching": frozenset({"training-core", "training-satellite", "rollout", "idle"}),
    "training-core": frozenset({"switching", "idle"}),
    "training-satellite": frozenset({"switching", "idle", "training-core"}),
}

CellEvent = CellRegistered | CellRoleChanged | CellEngineChanged
CELL_EVENTS: tuple[type[CellEvent], ...] = (CellRegistered, CellRoleChanged, CellEngineChanged)


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell as its events made it. ``seq`` and ``since`` are its last event's and its role's start; a reader
    that stores only some fields rebuilds the others from the catalogue's defaults (the fold never reads them)."""

    cell_id: str
    role: CellRole
    engine_url: str | None = None
    resident: bool = False
    node: str = "local"
    gpus: int = 1
    capacity: int = 1
    switch_from: CellRole | None = None  # the role before "switching", so a reader knows which way it goes
    since: datetime | None = None  # when the cell took its role (the event's occurred_at)
    reason: str = ""  # why it took it ("registered" for its registration)
    seq: int = 0  # the cell's last event: the next role change appends after it


def check_transition(cell_id: str, current: CellRole | None, from_role: CellRole, to_role: CellRole) -> None:
    """Raise Rejected unless ``current -> to_role`` is a legal step and the event's ``from_role`` is the truth."""
    if current is None:
        raise Rejected(f"cell {cell_id} is not registered", reason="unknown-cell")
    if from_role != current:
        raise Rejected(f"cell {cell_id} is {current}, not {from_role}", reason="wrong-role")
    if to_role not in TRANSITIONS[current]:
        raise Rejected(
            f"cell {cell_id}: {current} -> {to_role} is not a step of the role-change protocol",
            reason="illegal-transition",
        )


def cell_key(event: Event) -> str | None:
    """The cell a cell event is about; None for any other event (a reader keeping cells by id looks it up)."""
    return event.cell_id if isinstance(event, CELL_EVENTS) else None


def evolve_cell(cell: Cell | None, event: CellEvent, seq: int = 0) -> Cell:
    """The cell after ``event`` (``cell``: before it, None if never registered); raises Rejected by the rule
    above. Pure: the result depends on the arguments only."""
    return _FOLDS[type(event)](cell, event, seq)


def _registered(cell: Cell | None, e: CellRegistered, seq: int) -> Cell:
    if cell is not None:
        raise Rejected(f"cell {e.cell_id} is already registered", reason="duplicate-cell")
    if e.capacity < 0 or e.gpus < 0:
        raise Rejected(f"cell {e.cell_id}: capacity and gpus must be >= 0", reason="invalid-cell")
    return Cell(
        e.cell_id, e.role, e.engine_url, e.resident, e.node, e.gpus, e.capacity, None, e.occurred_at, "registered",
        seq,
    )  # fmt: skip


def _role_changed(cell: Cell | None, e: CellRoleChanged, seq: int) -> Cell:
    check_transition(e.cell_id, cell.role if cell else None, e.from_role, e.to_role)
    assert cell is not None
    if e.to_role in TRAINING_ROLES and cell.resident:
        raise Rejected(
            f"cell {e.cell_id} belongs to the resident rollout pool and never trains", reason="resident-never-trains"
        )
    return replace(
        cell,
        role=e.to_role,
        engine_url=e.engine_url if e.engine_url is not None else cell.engine_url,
        switch_from=cell.role if e.to_role == "switching" else None,
        since=e.occurred_at,
        reason=e.reason,
        seq=seq,
    )


def _engine_changed(cell: Cell | None, e: CellEngineChanged, seq: int) -> Cell:
    if cell is None:
        raise Rejected(f"engine change of unregistered cell {e.cell_id}", reason="unknown-cell")
    return replace(cell, engine_url=e.engine_url, seq=seq)


_FOLDS: dict[type[Event], Callable[[Cell | None, Any, int], Cell]] = {
    CellRegistered: _registered,
    CellRoleChanged: _role_changed,
    CellEngineChanged: _engine_changed,
}
