"""The scheduler's state as a pure in-memory fold of the log: cells, the watermark, the ready-data buffer and
staleness. The simulator folds its own events through it; the live service loads it from the SQL projection
(``load_state``), which applies the same rules row by row; both must agree snapshot for snapshot."""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from opengyre.aggregates import (
    CELL_EVENTS,
    ROLLOUT_ROLES,
    TRAINING_ROLES,
    Cell,
    CellEvent,
    Execution,
    evolve_cell,
    evolve_execution,
)
from opengyre.events import (
    CellRole,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    TrainingStepCompleted,
)
from opengyre.projection import Rejected

from ._rules import sample_staleness, version_step

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
    # Forget a finished execution once a step trained it (nothing later depends on it: the live controller's
    # ``load_state(full=False)`` leaves such rows out the same way). A long simulation has millions.
    prune_trained: bool = False
    # Indexes by role, kept with every change, so a policy's questions cost O(log cells), not a scan:
    # cells by registration order; the sorted orders of rollout cells outside the resident pool, of
    # training cells and of satellites; counts and capacities of cells on their way.
    _order: list[CellState] = field(default_factory=list)
    _pool: list[CellState] = field(default_factory=list)  # cells outside the resident pool, in order
    _pool_rank: dict[str, int] = field(default_factory=dict)
    _rollout_pool: list[int] = field(default_factory=list)
    _training: list[int] = field(default_factory=list)
    _satellites: list[int] = field(default_factory=list)
    _cores: int = 0
    _to_training: int = 0
    _to_rollout_capacity: int = 0
    _pool_moving: int = 0
    _pool_rollout_capacity: int = 0
    _gpus_by_role: dict[str, int] = field(default_factory=dict)

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
        return list(self._order)

    def training_cells(self) -> list[CellState]:
        """Cells in a training role, in registration order."""
        return [self._order[i] for i in self._training]

    def training_cells_reversed(self) -> Iterator[CellState]:
        """Cells in a training role, the last registered first (the prefix shrinks from its end)."""
        return (self._order[i] for i in reversed(self._training))

    def first_rollout_pool_cell(self) -> CellState | None:
        """The first cell in registration order that is in rollout and outside the resident pool."""
        return self._order[self._rollout_pool[0]] if self._rollout_pool else None

    def rollout_pool_cells(self) -> Iterator[CellState]:
        """Cells in rollout outside the resident pool, in registration order."""
        return (self._order[i] for i in self._rollout_pool)

    def first_satellite(self) -> CellState | None:
        return self._order[self._satellites[0]] if self._satellites else None

    @property
    def pool(self) -> list[CellState]:
        """Cells outside the resident pool (the ones that may train), in registration order. Do not modify."""
        return self._pool

    def pool_rank(self, cell: CellState) -> int:
        """The cell's position among the cells outside the resident pool."""
        return self._pool_rank[cell.cell_id]

    @property
    def training_count(self) -> int:
        return len(self._training)

    @property
    def core_count(self) -> int:
        return self._cores

    @property
    def heading_to_training_count(self) -> int:
        """Cells draining, or switching from rollout or idle towards training."""
        return self._to_training

    @property
    def heading_to_rollout_capacity(self) -> int:
        """Capacity of the cells switching back from training to rollout."""
        return self._to_rollout_capacity

    @property
    def pool_moving_count(self) -> int:
        """Cells outside the resident pool that are draining or switching."""
        return self._pool_moving

    @property
    def pool_rollout_capacity(self) -> int:
        """Capacity of the cells in rollout outside the resident pool."""
        return self._pool_rollout_capacity

    def gpus_in(self, role: CellRole) -> int:
        return self._gpus_by_role.get(role, 0)

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
        self._capacity = self._cores = self._to_training = self._to_rollout_capacity = 0
        self._pool_moving = self._pool_rollout_capacity = 0
        self._rollout_pool, self._training, self._satellites, self._gpus_by_role = [], [], [], {}
        self._order = sorted(self.cells.values(), key=lambda c: c.order)
        self._pool = [c for c in self._order if not c.resident]
        self._pool_rank = {c.cell_id: i for i, c in enumerate(self._pool)}
        for c in self._order:
            self._index(c, 1)
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
        fold = _FOLDS.get(type(event))
        if fold is None:
            return
        fold(self, event, seq)
        if seq > self.last_seq:
            self.last_seq = seq

    def _index(self, c: CellState, sign: int) -> None:
        """Add (sign 1) or remove (-1) the cell's contribution to every index, for its role now."""
        role = c.role
        self._gpus_by_role[role] = self._gpus_by_role.get(role, 0) + sign * c.gpus
        if role in ROLLOUT_ROLES:
            self._capacity += sign * c.capacity
            if not c.resident:
                self._pool_rollout_capacity += sign * c.capacity
                _sorted_update(self._rollout_pool, c.order, sign)
        elif role in TRAINING_ROLES:
            _sorted_update(self._training, c.order, sign)
            if role == "training-satellite":
                _sorted_update(self._satellites, c.order, sign)
            else:
                self._cores += sign
        elif role == "draining" or role == "switching":
            if not c.resident:
                self._pool_moving += sign
            if role == "switching" and c.switch_from in TRAINING_ROLES:
                self._to_rollout_capacity += sign * c.capacity
            else:
                self._to_training += sign

    def _execution_view(self, execution_id: str) -> Execution | None:
        """The aggregate's view of an execution the state holds (what ``evolve_execution`` reads)."""
        if execution_id in self.running:
            return Execution(execution_id)
        return Execution(execution_id, finished=True) if execution_id in self.finished else None

    def _dispatched(self, e: ExecutionDispatched, seq: int = 0) -> None:
        evolve_execution(self._execution_view(e.execution_id), e, seq)  # the one rule; it raises Rejected
        self.dispatch_execution(
            e.execution_id, e.group_id, e.step, e.weight_version, as_seconds(e.occurred_at), e.timeout_s, e.group_size
        )

    def dispatch_execution(
        self, execution_id: str, group_id: str, step: int, weight_version: str, at_s: float, timeout_s: float,
        group_size: int,
    ) -> None:  # fmt: skip
        """The fold of ``execution-dispatched`` (``apply`` calls it after ``evolve_execution`` judged the event;
        the simulator too, without building the event when it does not record them, so its refusal is restated
        here, on the hot path)."""
        if execution_id in self.running or execution_id in self.finished:
            raise Rejected(f"execution {execution_id} was already dispatched")
        vstep = version_step(weight_version, self.versions)
        self.running[execution_id] = RunningExecution(execution_id, group_id, step, vstep, at_s, timeout_s)
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = GroupState(group_id, step, vstep, group_size)
            self.untrained_by_version[vstep] = self.untrained_by_version.get(vstep, 0) + 1
        elif group_id in self._ready_groups:
            # A late member makes a complete group incomplete again: it leaves the ready buffer.
            del self._ready_groups[group_id]
            self._ready_samples -= g.finished
        g.dispatched += 1
        if group_size > g.size:
            g.size = group_size
        self.dispatched_total += 1
        if step > self.dispatched_step:
            self.dispatched_step = step

    def dispatch_group(
        self, execution_ids: list[str], group_id: str, step: int, weight_version: str, at_s: float,
        timeout_s: float, group_size: int,
    ) -> None:  # fmt: skip
        """``dispatch_execution`` for each of ``execution_ids`` in turn, of one group at one instant (the
        simulator's bursts): the same state, the shared work done once. Refuses the whole batch, before changing
        anything, if any of them was already dispatched."""
        running, finished = self.running, self.finished
        for xid in execution_ids:
            if xid in running or xid in finished:
                raise Rejected(f"execution {xid} was already dispatched")
        if len(set(execution_ids)) != len(execution_ids):
            raise Rejected(f"group {group_id}: an execution id appears twice in one dispatch")
        if not execution_ids:
            return
        vstep = version_step(weight_version, self.versions)
        g = self.groups.get(group_id)
        if g is None:
            g = self.groups[group_id] = GroupState(group_id, step, vstep, group_size)
            self.untrained_by_version[vstep] = self.untrained_by_version.get(vstep, 0) + 1
        elif group_id in self._ready_groups:
            del self._ready_groups[group_id]
            self._ready_samples -= g.finished
        for xid in execution_ids:
            running[xid] = RunningExecution(xid, group_id, step, vstep, at_s, timeout_s)
        n = len(execution_ids)
        g.dispatched += n
        if group_size > g.size:
            g.size = group_size
        self.dispatched_total += n
        if step > self.dispatched_step:
            self.dispatched_step = step

    def _finished(self, e: ExecutionFinished, seq: int = 0) -> None:
        evolve_execution(self._execution_view(e.execution_id), e, seq)  # the one rule; it raises Rejected
        self.finish_execution(e.execution_id, e.score is not None, as_seconds(e.occurred_at))

    def finish_execution(self, execution_id: str, valid: bool, at_s: float) -> None:
        """The fold of ``execution-finished`` (``valid``: it has a score)."""
        r = self.running.pop(execution_id, None)
        if r is None:
            if execution_id in self.finished:
                raise Rejected(f"execution {execution_id} already finished")
            raise Rejected(f"execution {execution_id} finished but was never dispatched")
        self.finished[execution_id] = (r.group_id, r.version_step, None)
        self.finished_total += 1
        g = self.groups[r.group_id]
        g.finished += 1
        g.valid += valid
        g.last_finished_at = at_s
        if g.finished == g.dispatched and g.finished >= max(g.size, 1) and g.consumed_step is None:  # g.complete
            self._ready_groups[g.group_id] = None
            self._ready_log.append(g.group_id)
            self._ready_samples += g.finished
            self.ready_rev += 1

    def _cell_event(self, e: CellEvent, seq: int) -> None:
        # The rule is the cell aggregate's; this fold only keeps its indexes in step with the result.
        old = self.cells.get(e.cell_id)
        cell = evolve_cell(_view(old) if old is not None else None, e, seq)
        if old is None:
            c = CellState(
                cell.cell_id, cell.node, cell.gpus, cell.capacity, cell.role, cell.engine_url, cell.resident,
                len(self.cells), seq, as_seconds(cell.since) if cell.since is not None else 0.0,
            )  # fmt: skip
            self.cells[c.cell_id] = c
            self._order.append(c)
            if not c.resident:
                self._pool_rank[c.cell_id] = len(self._pool)
                self._pool.append(c)
            self._index(c, 1)
            return
        if cell.role != old.role or cell.switch_from != old.switch_from:
            self._index(old, -1)
            old.role, old.switch_from = cell.role, cell.switch_from
            self._index(old, 1)
        if cell.since is not None:  # a role change (the view handed in has none): the role's start moved
            old.role_since = as_seconds(cell.since)
        old.engine_url, old.role_seq = cell.engine_url, cell.seq

    def _step_completed(self, e: TrainingStepCompleted, seq: int = 0) -> None:
        if e.step <= self.trained_step:
            raise Rejected(f"training step {e.step} is not after step {self.trained_step}")
        if e.weight_version and e.weight_version in self.versions:
            raise Rejected(f"weight version {e.weight_version} was already published")
        trained = dict.fromkeys(e.execution_ids)
        # Executions the step dropped (masked, filtered, no signal) are consumed too, without being samples: a
        # step that dropped a whole group must still take it out of the ready buffer.
        for xid in [*trained, *(x for x in e.dropped if x not in trained)]:
            known = self.finished.get(xid)
            if known is None or known[2] is not None:
                continue  # still running, never seen, or already trained on: not a sample this step consumes
            gid, vstep, _ = known
            if self.prune_trained:
                del self.finished[xid]
            else:
                self.finished[xid] = (gid, vstep, e.step)
            if xid in trained:
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
        if e.weight_version:  # a step that updated nothing published no weights
            self.versions[e.weight_version] = e.step
        self.ready_rev += 1


def _view(c: CellState) -> Cell:
    """The aggregate's view of a cell the state holds (what ``evolve_cell`` reads)."""
    return Cell(
        c.cell_id, c.role, c.engine_url, c.resident, c.node, c.gpus, c.capacity, c.switch_from, None, "", c.role_seq
    )


def _sorted_update(xs: list[int], x: int, sign: int) -> None:
    if sign > 0:
        insort(xs, x)
    else:
        del xs[bisect_left(xs, x)]


_FOLDS: dict[type[Event], Callable[[SchedulerState, Any, int], None]] = {
    ExecutionDispatched: SchedulerState._dispatched,
    ExecutionFinished: SchedulerState._finished,
    **dict.fromkeys(CELL_EVENTS, SchedulerState._cell_event),
    TrainingStepCompleted: SchedulerState._step_completed,
}
