"""The discrete-event simulator: a simulated clock drives the real policy, the real command checks and the real
state fold. Every change is an event folded through ``SchedulerState.apply``, exactly as the live service
folds the log, so a recorded run can be replayed into the SQL projection and the live path compared."""

from __future__ import annotations

import heapq
from collections import deque
from datetime import UTC, datetime, timedelta

import numpy as np

from opengyre.events import (
    CellRegistered,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    TrainingStepCompleted,
)

from .._commands import CommandRefused, arrival_role, check_role_request, core_heir, protocol
from .._packing import MicroStep
from .._policy import Decision, DispatchRequest, Policy, RoleRequest, View
from .._rules import TRAINING_ROLES
from .._state import SchedulerState
from ._config import SimConfig
from ._result import Segment, SimResult, StepRecord, ideal_bound

__all__ = ["EPOCH", "Simulator", "simulate"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_EXEC, _SWITCH, _MICRO, _STEP = 0, 1, 2, 3


class Simulator:
    def __init__(self, config: SimConfig, policy: Policy) -> None:
        config.validate()
        self.cfg = config
        self.policy = policy
        self.loop = config.loop
        self.state = SchedulerState()
        self.packer = policy.packing_buffer(config.loop)
        self.t = 0.0
        self.seq = 0
        self.events: list[Event] = []
        self.decisions: list[tuple[int, float, Decision]] = []  # (seq seen, time, decision) when recording
        self._heap: list[tuple[float, int, int, str, object]] = []
        self._tie = 0
        rng = np.random.default_rng(config.seed)
        # Common random numbers: the k-th group dispatched lasts the same under every policy (for the batch loop,
        # group g of batch b is the ((b-1)*G + g)-th). Room for policies that start more groups than the loop
        # trains (carry-over keeps extra groups in flight; a staleness cap drops some).
        self._pool = 3 * self.loop.steps * self.loop.groups_per_step
        self._durations = config.workload.sample(rng, self._pool)
        self._next_group = 0
        self._queue: deque[str] = deque()
        self._started = 0
        self._dur: dict[str, float] = {}
        self._members: dict[str, list[str]] = {}
        self._micro: dict[str, tuple[MicroStep, int]] = {}  # cell -> (claimed micro-step, token)
        self._token = 0
        self._micro_done: dict[str, int] = {}  # cell -> micro-steps completed (faster cells should do more)
        self._step_pending = False
        self._segments: list[Segment] = []
        self._last_t = 0.0
        self._steps: list[StepRecord] = []
        self.refusals: list[str] = []
        self.reroutes = 0
        self.switches = 0
        self._ref_gpus = config.costs.reference_gpus

    # --- plumbing ------------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self.seq += 1
        self.state.apply(event, self.seq)
        if self.cfg.record_events:
            self.events.append(event)

    def _at(self) -> datetime:
        return EPOCH + timedelta(seconds=self.t)

    def _schedule(self, at: float, kind: int, key: str, payload: object = None) -> None:
        self._tie += 1
        heapq.heappush(self._heap, (at, self._tie, kind, key, payload))

    # --- the run -------------------------------------------------------------------------------------

    def run(self) -> SimResult:
        cl = self.cfg.cluster
        for i in range(cl.cells + cl.resident_cells):
            resident = i >= cl.cells
            self._emit(
                CellRegistered(
                    cell_id=f"{'pool' if resident else 'cell'}{i}", node=f"nodes{i * cl.nodes_per_cell}",
                    gpus=cl.gpus_of(i), capacity=cl.slots_per_cell, role="rollout", resident=resident,
                    occurred_at=self._at(),
                )
            )  # fmt: skip
        self._settle()
        while self._heap and self.state.trained_step < self.loop.steps:
            now = self._heap[0][0]
            self._account(now)
            self.t = now
            while self._heap and self._heap[0][0] == now:
                _, _, kind, key, payload = heapq.heappop(self._heap)
                self._handle(kind, key, payload)
            self._settle()
        self._account(self.t)
        return SimResult.build(
            policy=self.policy.name, config=self.cfg, state=self.state, steps=self._steps,
            segments=self._segments, refusals=self.refusals,
            bound=ideal_bound(
                self.cfg,
                self._durations[: self.loop.steps * self.loop.groups_per_step].reshape(
                    self.loop.steps, self.loop.groups_per_step, self.loop.group_size
                ),
                batch_chain=self.policy.packing == "batch",
            ),
            reroutes=self.reroutes, switches=self.switches, events=self.seq, microsteps_by_cell=self._micro_done,
        )  # fmt: skip

    def _handle(self, kind: int, key: str, payload: object) -> None:
        if kind == _EXEC:
            self._started -= 1
            dur = self._dur.pop(key)
            timed_out = dur >= self.cfg.workload.timeout_s
            self._emit(
                ExecutionFinished(
                    execution_id=key, status="timed-out" if timed_out else "completed", score=0.0 if timed_out else 1.0,
                    occurred_at=self._at(),
                )
            )  # fmt: skip
        elif kind == _SWITCH:
            self._switch_done(key, str(payload))
        elif kind == _MICRO:
            held = self._micro.get(key)
            if held is None or held[1] != payload:
                return  # the cell left training; the micro-step went back to the buffer
            del self._micro[key]
            self._micro_done[key] = self._micro_done.get(key, 0) + 1
            if self.packer.complete(held[0]):
                self._step_pending = True
                self._schedule(self.t + self.cfg.costs.step_overhead_s, _STEP, str(held[0].step))
        elif kind == _STEP:
            self._step_done(int(key))

    def _settle(self) -> None:
        """Let the policy act on this instant until it has nothing more to say, then fill slots and trainers."""
        for _ in range(16):
            self._start_queued()
            d = self.policy.decide(View(self.state, self.t, self.loop))
            if self.cfg.record_events and d:
                self.decisions.append((self.seq, self.t, d))
            changed = False
            for r in d.roles:  # roles first: a fixed split or a drain is judged on the watermark before the burst
                changed |= self._request(r)
            for req in d.dispatch:
                changed |= self._dispatch(req)
            if not changed:
                break
        self._start_queued()
        self._train()

    # --- rollout -------------------------------------------------------------------------------------

    def _dispatch(self, req: DispatchRequest) -> bool:
        step = req.step
        if step <= self.state.dispatched_step or req.groups < 1:
            return False
        if self._next_group + req.groups > self._pool:
            self.refusals.append(f"t={self.t:.0f}s dispatch {req}: the simulated workload has no more groups")
            return False
        version = f"v{self.state.trained_step}"
        timeout = self.cfg.workload.timeout_s
        at = self._at()
        for g in range(req.groups):
            gid = f"s{step}-g{g}"
            members = self._members[gid] = []
            for k in range(self.loop.group_size):
                xid = f"{gid}-e{k}"
                members.append(xid)
                self._dur[xid] = float(self._durations[self._next_group, k])
                self._emit(
                    ExecutionDispatched(
                        execution_id=xid, task_id=f"task-s{step}-g{g}", group_id=gid, step=step,
                        weight_version=version, timeout_s=timeout, group_size=self.loop.group_size, occurred_at=at,
                    )
                )  # fmt: skip
                self._queue.append(xid)
            self._next_group += 1
        return True

    def _start_queued(self) -> None:
        cap = self.state.rollout_capacity
        while self._queue and self._started < cap:
            xid = self._queue.popleft()
            self._started += 1
            self._schedule(self.t + self._dur[xid], _EXEC, xid)

    # --- the actuator, simulated -----------------------------------------------------------------------

    def _request(self, req: RoleRequest) -> bool:
        cell = self.state.cells.get(req.cell_id)
        if cell is not None and cell.role == "switching":
            return False  # its switch completes on the clock; the simulated actuator never stops half-way
        try:
            check_role_request(self.state, req)
        except CommandRefused as exc:
            self.refusals.append(f"t={self.t:.0f}s {req.cell_id}->{req.target}: {exc.message}")
            return False
        steps = protocol(self.state, req.cell_id, req.target)
        if not steps:
            return False
        cell = self.state.cells[req.cell_id]
        at = self._at()
        self.switches += 1
        if req.target == "training":
            for frm, to in steps[:-1]:
                if to == "switching" and frm == "draining":
                    # The proxy rerouted the cell's share of live executions; the rule guaranteed room for them.
                    share = cell.capacity / max(self.state.rollout_capacity + cell.capacity, 1)
                    self.reroutes += round(self._started * share)
                self._emit(CellRoleChanged(cell_id=req.cell_id, from_role=frm, to_role=to, reason=req.reason,
                                           occurred_at=at))  # fmt: skip
            self._schedule(self.t + self.cfg.costs.to_training_s, _SWITCH, req.cell_id, "training")
            return True
        if cell.role in TRAINING_ROLES:
            held = self._micro.pop(req.cell_id, None)
            if held is not None:
                self.packer.release(held[0])
            if cell.role == "training-core":
                heir = core_heir(self.state)
                if heir is not None:  # the authoritative weights and optimizer state move before the core leaves
                    self._emit(
                        CellRoleChanged(
                            cell_id=heir.cell_id, from_role="training-satellite", to_role="training-core",
                            reason="core hand-over", occurred_at=at,
                        )
                    )  # fmt: skip
        for frm, to in steps:
            if to == "rollout" and frm == "switching":
                self._schedule(self.t + self.cfg.costs.to_rollout_s, _SWITCH, req.cell_id, "rollout")
                return True
            self._emit(CellRoleChanged(cell_id=req.cell_id, from_role=frm, to_role=to, reason=req.reason,
                                       occurred_at=at))  # fmt: skip
        return True

    def _switch_done(self, cell_id: str, target: str) -> None:
        to = arrival_role(self.state) if target == "training" else "rollout"
        self._emit(CellRoleChanged(cell_id=cell_id, from_role="switching", to_role=to, occurred_at=self._at(),
                                   reason="trainer worker up" if target == "training" else "engine up"))  # fmt: skip

    # --- training ------------------------------------------------------------------------------------

    def _train(self) -> None:
        if self._step_pending:
            return
        self.packer.sync(self.state)
        if not self.packer.available:
            return
        cells = self.state.training_cells()
        if not any(c.role == "training-core" for c in cells):
            return  # nobody holds the authoritative weights yet
        # Faster cells first: with unequal cells they claim more and the step ends together.
        for c in sorted(cells, key=lambda c: -c.gpus):
            if c.cell_id in self._micro:
                continue
            m = self.packer.claim(c.cell_id)
            if m is None:
                return
            self._token += 1
            self._micro[c.cell_id] = (m, self._token)
            took = self.cfg.costs.micro_step_s * self._ref_gpus / max(c.gpus, 1) * len(m.group_ids)
            took /= self.loop.micro_groups * m.parts
            self._schedule(self.t + took, _MICRO, c.cell_id, self._token)

    def _step_done(self, step: int) -> None:
        groups = self.packer.groups()
        ids = [x for g in groups for x in self._members[g]]
        before = dict(self.state.staleness_hist)
        self._emit(
            TrainingStepCompleted(
                step=step, weight_version=f"v{step}", loss=0.0, n_samples=len(ids), n_tokens=0, execution_ids=ids,
                occurred_at=self._at(),
            )
        )  # fmt: skip
        stale = {k: v - before.get(k, 0) for k, v in self.state.staleness_hist.items() if v - before.get(k, 0)}
        n = sum(stale.values())
        self._steps.append(
            StepRecord(step, self.t, sum(k * v for k, v in stale.items()) / n if n else 0.0, max(stale, default=0))
        )
        self._step_pending = False

    # --- utilisation ---------------------------------------------------------------------------------

    def _account(self, until: float) -> None:
        if until <= self._last_t:
            return
        roll = train_busy = train_idle = switching = idle = 0.0
        for c in self.state.cells.values():
            if c.role == "rollout":
                roll += c.gpus
            elif c.role in TRAINING_ROLES:
                if c.cell_id in self._micro:
                    train_busy += c.gpus
                else:
                    train_idle += c.gpus
            elif c.role in ("draining", "switching"):
                switching += c.gpus
            else:
                idle += c.gpus
        cap = self.state.rollout_capacity
        busy = roll * (min(self._started, cap) / cap) if cap else 0.0
        self._segments.append(Segment(self._last_t, until, busy, roll - busy, train_busy, train_idle, switching + idle))
        self._last_t = until


def simulate(config: SimConfig, policy: Policy) -> SimResult:
    return Simulator(config, policy).run()
