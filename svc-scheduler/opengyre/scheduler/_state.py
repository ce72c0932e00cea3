"""The scheduler's state as a pure in-memory fold of the log: cells, the watermark, the ready-data buffer and
staleness. The simulator folds its own events through it; the live service loads it from the SQL projection
(``load_state``), which applies the same rules row by row; both must agree snapshot for snapshot."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opengyre.events import (
    CellRegistered,
    CellRole,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    TrainingStepCompleted,
)
from opengyre.projection import Rejected

from ._rules import ROLLOUT_ROLES, TRAINING_ROLES, check_transition, sample_staleness, version_step

__all__ = ["CellState", "GroupState", "RunningExecution", "SchedulerState", "as_seconds"]


def as_seconds(ts: datetime) -> float:
    """Seconds since the epoch; naive datetimes (SQLite hands them back) are UTC."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return ts.timestamp()


@dataclass(slots=True)
class CellState:
    cell_id: str
    node: str
    gpus: int
    capacity: int
    role: CellRole
    engine_url: str | None
    resident: bool
    order: int  # registration order: cells turn to training as a growing prefix of this order
    role_seq: int
    role_since: float
    # The role the cell had before "switching", so a reader knows which way the switch goes.
    switch_from: CellRole | None = None


@dataclass(slots=True)
class RunningExecution:
    execution_id: str
    group_id: str
    step: int  # the training step (batch) the execution's group is destined for
    version_step: int  # the policy version (training steps done) that generated it
    dispatched_at: float
    timeout_s: float


@dataclass(slots=True)
class GroupState:
    group_id: str
    step: int
    version_step: int
    size: int  # expected members (0 = unknown: complete once every dispatched member finished)
    dispatched: int = 0
    finished: int = 0
    valid: int = 0  # finished with a valid score (evaluator and infra failures are masked)
    last_finished_at: float = 0.0
    consumed_step: int | None = None

    @property
    def complete(self) -> bool:
        return self.finished == self.dispatched and self.finished >= max(self.size, 1)


@dataclass
class SchedulerState:
    """Everything a policy may look at. ``apply`` raises Rejected exactly where the SQL projection does."""

    cells: dict[str, CellState] = field(default_factory=dict)
    running: dict[str, RunningExecution] = field(default_factory=dict)
    groups: dict[str, GroupState] = field(default_factory=dict)
    # Finished executions: id -> (group, version step, consumed step or None). Staleness is per sample.
    finished: dict[str, tuple[str, int, int | None]] = field(default_factory=dict)
    versions: dict[str, int] = field(default_factory=dict)  # weight_version -> step that published it
    trained_step: int = 0
    dispatched_step: int = 0  # highest batch (training step) any execution was dispatched for
    dispatched_total: int = 0
    finished_total: int = 0
    consumed_samples: int = 0
    consumed_groups: int = 0
    staleness_hist: dict[int, int] = field(default_factory=dict)  # staleness -> trained samples
    last_seq: int = 0
    # Incremental aggregates (the simulator asks for them after every event).
    _capacity: int = 0
    _ready_groups: dict[str, None] = field(default_factory=dict)  # complete, unconsumed, in completion order
    _ready_samples: int = 0
    _ready_log: list[str] = field(default_factory=list)  # every group as it became ready, in that order
    ready_rev: int = 0  # bumped whenever the ready buffer changes, so the packing buffer rescans only then
    # Groups not yet trained on (running, complete or partial), by the policy version that generated them.
    untrained_by_version: dict[int, int] = field(default_factory=dict)

    # --- queries -------------------------------------------------------------------------------------

    @property
    def watermark(self) -> int:
        """w(t) = dispatched - finished."""
        return self.dispatched_total - self.finished_total

    @property
    def rollout_capacity(self) -> int:
        """CR(t): executions the cells now in rollout can hold."""
        return self._capacity

    def cells_in_order(self) -> list[CellState]:
        return sorted(self.cells.values(), key=lambda c: c.order)

    def training_cells(self) -> list[CellState]:
        return [c for c in self.cells_in_order() if c.role in TRAINING_ROLES]

    def ready_groups(self) -> list[GroupState]:
        """Complete groups not yet trained on, oldest completion first (the packing buffer's input)."""
        return [self.groups[g] for g in self._ready_groups]

    def ready_since(self, position: int) -> list[GroupState]:
        """Groups that became ready at or after ``position`` of the ready log and still are, in that order."""
        return [self.groups[g] for g in self._ready_log[position:] if g in self._ready_groups]

    @property
    def ready_log_length(self) -> int:
        return len(self._ready_log)

    @property
    def ready_samples(self) -> int:
        return self._ready_samples

    @property
    def ready_group_count(self) -> int:
        return len(self._ready_groups)

    def restore_derived(self, *, ready_in_order: list[str]) -> None:
        """Recompute the incremental aggregates after the state was filled from stored rows (``load_state``)."""
        self._capacity = sum(c.capacity for c in self.cells.values() if c.role in ROLLOUT_ROLES)
        self._ready_groups = dict.fromkeys(ready_in_order)
        self._ready_log = list(ready_in_order)
        self._ready_samples = sum(self.groups[g].finished for g in ready_in_order)
        self.untrained_by_version = {}
        for g in self.groups.values():
            if g.consumed_step is None:
                self.untrained_by_version[g.version_step] = self.untrained_by_version.get(g.version_step, 0) + 1

    def staleness_mean(self) -> float:
        n = sum(self.staleness_hist.values())
        return sum(k * v for k, v in self.staleness_hist.items()) / n if n else 0.0

    def staleness_max(self) -> int:
        return max(self.staleness_hist, default=0)

    def snapshot(self) -> dict[str, Any]:
        """A canonical, comparable picture (rebuild = live, simulator = live)."""
        return {
            "cells": sorted(
                (c.cell_id, c.node, c.gpus, c.capacity, c.role, c.engine_url, c.resident, c.order, c.switch_from)
                for c in self.cells.values()
            ),
            "running": sorted((r.execution_id, r.group_id, r.step, r.version_step) for r in self.running.values()),
            "groups": sorted(
                (g.group_id, g.step, g.version_step, g.size, g.dispatched, g.finished, g.valid, g.consumed_step)
                for g in self.groups.values()
            ),
            "ready": [g.group_id for g in self.ready_groups()],
            "versions": sorted(self.versions.items()),
            "trained_step": self.trained_step,
            "dispatched_step": self.dispatched_step,
            "watermark": self.watermark,
            "rollout_capacity": self.rollout_capacity,
            "ready_samples": self.ready_samples,
            "staleness": sorted(self.staleness_hist.items()),
            "untrained_by_version": sorted(self.untrained_by_version.items()),
        }

    # --- the fold ------------------------------------------------------------------------------------

    def apply(self, event: Event, seq: int = 0) -> None:
        if isinstance(event, ExecutionDispatched):
            self._dispatched(event)
        elif isinstance(event, ExecutionFinished):
            self._finished(event)
        elif isinstance(event, CellRegistered):
            self._registered(event, seq)
        elif isinstance(event, CellRoleChanged):
            self._role_changed(event, seq)
        elif isinstance(event, TrainingStepCompleted):
            self._step_completed(event)
        else:
            return
        self.last_seq = max(self.last_seq, seq)

    def _dispatched(self, e: ExecutionDispatched) -> None:
        if e.execution_id in self.running or e.execution_id in self.finished:
            raise Rejected(f"execution {e.execution_id} was already dispatched")
        vstep = version_step(e.weight_version, self.versions)
        self.running[e.execution_id] = RunningExecution(
            e.execution_id, e.group_id, e.step, vstep, as_seconds(e.occurred_at), e.timeout_s
        )
        g = self.groups.get(e.group_id)
        if g is None:
            g = self.groups[e.group_id] = GroupState(e.group_id, e.step, vstep, e.group_size)
            self.untrained_by_version[vstep] = self.untrained_by_version.get(vstep, 0) + 1
        elif e.group_id in self._ready_groups:
            # A late member makes a complete group incomplete again: it leaves the ready buffer.
            del self._ready_groups[e.group_id]
            self._ready_samples -= g.finished
        g.dispatched += 1
        g.size = max(g.size, e.group_size)
        self.dispatched_total += 1
        self.dispatched_step = max(self.dispatched_step, e.step)

    def _finished(self, e: ExecutionFinished) -> None:
        r = self.running.pop(e.execution_id, None)
        if r is None:
            if e.execution_id in self.finished:
                raise Rejected(f"execution {e.execution_id} already finished")
            raise Rejected(f"execution {e.execution_id} finished but was never dispatched")
        self.finished[e.execution_id] = (r.group_id, r.version_step, None)
        self.finished_total += 1
        g = self.groups[r.group_id]
        g.finished += 1
        g.valid += e.score is not None
        g.last_finished_at = as_seconds(e.occurred_at)
        if g.complete and g.consumed_step is None:
            self._ready_groups[g.group_id] = None
            self._ready_log.append(g.group_id)
            self._ready_samples += g.finished
            self.ready_rev += 1

    def _registered(self, e: CellRegistered, seq: int) -> None:
        if e.cell_id in self.cells:
            raise Rejected(f"cell {e.cell_id} is already registered")
        if e.capacity < 0 or e.gpus < 0:
            raise Rejected(f"cell {e.cell_id}: capacity and gpus must be >= 0")
        cell = CellState(
            e.cell_id, e.node, e.gpus, e.capacity, e.role, e.engine_url, e.resident, len(self.cells), seq,
            as_seconds(e.occurred_at),
        )  # fmt: skip
        self.cells[e.cell_id] = cell
        if cell.role in ROLLOUT_ROLES:
            self._capacity += cell.capacity

    def _role_changed(self, e: CellRoleChanged, seq: int) -> None:
        cell = self.cells.get(e.cell_id)
        check_transition(e.cell_id, cell.role if cell else None, e.from_role, e.to_role)
        assert cell is not None
        if e.to_role in TRAINING_ROLES and cell.resident:
            raise Rejected(f"cell {e.cell_id} belongs to the resident rollout pool and never trains")
        if cell.role in ROLLOUT_ROLES:
            self._capacity -= cell.capacity
        if e.to_role in ROLLOUT_ROLES:
            self._capacity += cell.capacity
        cell.switch_from = cell.role if e.to_role == "switching" else None
        cell.role = e.to_role
        cell.role_seq = seq
        cell.role_since = as_seconds(e.occurred_at)
        if e.engine_url is not None:
            cell.engine_url = e.engine_url

    def _step_completed(self, e: TrainingStepCompleted) -> None:
        if e.step <= self.trained_step:
            raise Rejected(f"training step {e.step} is not after step {self.trained_step}")
        if e.weight_version in self.versions:
            raise Rejected(f"weight version {e.weight_version} was already published")
        for xid in dict.fromkeys(e.execution_ids):
            known = self.finished.get(xid)
            if known is None or known[2] is not None:
                continue  # still running, never seen, or already trained on: not a sample this step consumes
            gid, vstep, _ = known
            self.finished[xid] = (gid, vstep, e.step)
            d = sample_staleness(e.step, vstep)
            self.staleness_hist[d] = self.staleness_hist.get(d, 0) + 1
            self.consumed_samples += 1
            g = self.groups[gid]
            if g.consumed_step is None:
                g.consumed_step = e.step
                self.consumed_groups += 1
                left = self.untrained_by_version[g.version_step] - 1
                if left:
                    self.untrained_by_version[g.version_step] = left
                else:
                    del self.untrained_by_version[g.version_step]
                if gid in self._ready_groups:
                    del self._ready_groups[gid]
                    self._ready_samples -= g.finished
        self.trained_step = e.step
        self.versions[e.weight_version] = e.step
        self.ready_rev += 1
