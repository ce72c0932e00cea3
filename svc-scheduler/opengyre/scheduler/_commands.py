"""The command layer: every role change, whoever asks (a policy, an operator over gRPC, the simulator), is
checked here against the state before anything happens. A refused command changes nothing."""

from __future__ import annotations

from typing import Literal, cast

from sqlalchemy import String

from opengyre.events import CellRegistered, CellRole

from ._policy import RoleRequest, Target
from ._rules import ROLLOUT_ROLES, TRAINING_ROLES, watermark_allows
from ._state import CellState, SchedulerState
from ._tables import CELLS

__all__ = [
    "CommandRefused",
    "RefusalCode",
    "arrival_role",
    "check_drain",
    "check_engine_url",
    "check_registration",
    "check_role_request",
    "core_heir",
    "protocol",
]

RefusalCode = Literal["not-found", "failed-precondition", "already-exists", "invalid-argument", "resource-exhausted"]


class CommandRefused(Exception):
    def __init__(self, code: RefusalCode, message: str) -> None:
        super().__init__(message)
        self.code: RefusalCode = code
        self.message = message


def check_registration(state: SchedulerState, e: CellRegistered) -> None:
    if not e.cell_id:
        raise CommandRefused("invalid-argument", "cell_id is required")
    for name in ("cell_id", "node", "engine_url"):
        # The projection's column widths (PostgreSQL enforces them; an event that does not fit would stop it).
        limit = cast(String, CELLS.c[name].type).length or 0
        if len(getattr(e, name) or "") > limit:
            raise CommandRefused("invalid-argument", f"cell {e.cell_id[:64]}: {name} is longer than {limit} characters")
    if e.cell_id in state.cells:
        raise CommandRefused("already-exists", f"cell {e.cell_id} is already registered")
    if e.capacity < 1 and e.role == "rollout":
        raise CommandRefused("invalid-argument", f"cell {e.cell_id}: a rollout cell needs capacity >= 1")
    if e.gpus < 0 or e.capacity < 0:
        raise CommandRefused("invalid-argument", f"cell {e.cell_id}: gpus and capacity must be >= 0")
    if e.role not in ("idle", "rollout"):
        raise CommandRefused("invalid-argument", f"cell {e.cell_id}: a new cell starts idle or in rollout")


def check_engine_url(cell_id: str, url: str) -> None:
    limit = cast(String, CELLS.c["engine_url"].type).length or 0
    if not url:
        raise CommandRefused("invalid-argument", f"cell {cell_id}: engine_url is required")
    if len(url) > limit:
        raise CommandRefused("invalid-argument", f"cell {cell_id}: engine_url is longer than {limit} characters")


def check_role_request(state: SchedulerState, req: RoleRequest) -> None:
    """Refuse what the protocol or the watermark rule forbids; pass what may start now."""
    cell = state.cells.get(req.cell_id)
    if cell is None:
        raise CommandRefused("not-found", f"cell {req.cell_id} is not registered")
    if req.target not in ("training", "rollout"):
        raise CommandRefused("invalid-argument", f"target must be training or rollout, not {req.target!r}")
    if req.target == "training":
        if cell.resident:
            raise CommandRefused("failed-precondition", f"cell {req.cell_id} is in the resident rollout pool")
        # draining / switching: a switch that stopped half-way (a failed drain, a trainer that did not start)
        # is resumed from where it is; the cell's capacity already left CR(t).
        if cell.role not in ("rollout", "idle", "draining", "switching"):
            raise CommandRefused("failed-precondition", f"cell {req.cell_id} is already {cell.role}")
        if cell.role in ROLLOUT_ROLES:
            _check_watermark(state, cell)
        return
    if cell.role not in (*TRAINING_ROLES, "idle", "draining", "switching"):
        raise CommandRefused("failed-precondition", f"cell {req.cell_id} is already {cell.role}")


def check_drain(state: SchedulerState, cell_id: str) -> None:
    """An operator's drain takes a rollout cell out of service: the same watermark rule as any cell leaving."""
    cell = state.cells.get(cell_id)
    if cell is None:
        raise CommandRefused("not-found", f"cell {cell_id} is not registered")
    if cell.role not in ROLLOUT_ROLES:
        raise CommandRefused("failed-precondition", f"cell {cell_id} is {cell.role}; only a rollout cell drains")
    _check_watermark(state, cell)


def _check_watermark(state: SchedulerState, cell: CellState) -> None:
    """The one place a cell leaving rollout is judged: w(t) <= CR(t) - Ce."""
    if not watermark_allows(state.watermark, state.rollout_capacity, cell.capacity):
        raise CommandRefused(
            "failed-precondition",
            f"watermark: w={state.watermark} executions live but CR-Ce="
            f"{state.rollout_capacity - cell.capacity}; moving {cell.cell_id} would leave some without capacity",
        )


def protocol(state: SchedulerState, cell_id: str, target: Target) -> list[tuple[CellRole, CellRole]]:
    """The ordered role steps from the cell's role now to ``target`` (the final training role is decided when
    the switch completes: the first cell to arrive holds the authoritative weights and becomes the core)."""
    role = state.cells[cell_id].role
    if target == "training":
        if role == "rollout":
            return [("rollout", "draining"), ("draining", "switching"), ("switching", "training-satellite")]
        if role == "idle":
            return [("idle", "switching"), ("switching", "training-satellite")]
        if role == "draining":
            return [("draining", "switching"), ("switching", "training-satellite")]
        if role == "switching":
            return [("switching", "training-satellite")]
        return []
    if role in TRAINING_ROLES:
        return [(role, "switching"), ("switching", "rollout")]
    if role in ("idle", "draining", "switching"):
        return [(role, "rollout")]
    return []


def arrival_role(state: SchedulerState) -> CellRole:
    """The training role of a cell finishing its switch: core if no cell holds the authoritative state yet."""
    return "training-satellite" if state.core_count else "training-core"


def core_heir(state: SchedulerState) -> CellState | None:
    """The satellite that takes the authoritative state over when the core leaves (the first in order)."""
    return state.first_satellite()
