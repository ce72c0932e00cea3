"""The discrete-event simulator: a simulated clock drives the real policy, the real command checks and the real
state fold. Every change is an event folded through ``SchedulerState.apply``, exactly as the live service
folds the log, so a recorded run can be replayed into the SQL projection and the live path compared."""

from __future__ import annotations

import heapq
from collections import deque
from datetime import UTC, datetime, timedelta

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
from ._slots import Slots
from ._workload import GroupDurations

__all__ = ["EPOCH", "SimulationStalled", "Simulator", "simulate"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_EXEC, _SWITCH, _MICRO, _STEP = 0, 1, 2, 3


class SimulationStalled(RuntimeError):
    """The run cannot finish: nothing is left to happen (or the policy only discards work). Never a ratio."""

    def __init__(self, policy: str, step: int, steps: int, at_s: float, reason: str) -> None:
        super().__init__(f"{policy} stalled at step {step} of {steps} (t = {at_s / 3600:.2f} h): {reason}")
        self.policy, self.step, self.steps, self.at_s, self.reason = policy, step, steps, at_s, reason


class Simulator:
    def __init__(self, config: SimConfig, policy: Policy) -> None:
        config.validate()
        policy.validate(config.loop)
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
        # Common random numbers: the k-th group dispatched lasts the same under every policy (for the batch loop,
        # group g of batch b is the ((b-1)*G + g)-th), drawn lazily: a policy may dispatch more than it trains.
        self._source = GroupDurations(config.workload, config.seed)
        # Room for what the run trains several times over, plus whatever fills every slot at once.
        self._max_groups = int(config.max_dispatch_factor * self.loop.steps * self.loop.groups_per_step) + (
            config.cluster.total_slots // self.loop.group_size
        )
        self._next_group = 0
        self._queue: deque[str] = deque()
        self._slots = Slots()
        self._dur: dict[str, float] = {}  # running or queued execution -> its duration, without moves
        self._t0: dict[str, float] = {}  # running execution -> start
        self._end: dict[str, float] = {}  # running execution -> when it finishes (moves push this back)
        self._token: dict[str, int] = {}  # running execution -> the finish event that still counts
        self._delay: dict[str, float] = {}  # running execution -> move costs so far
        self._gidx: dict[str, int] = {}  # group -> its index in the duration stream
        self._gslot: dict[str, float] = {}  # group -> slot-seconds its finished members held
        self._trained: list[int] = []  # indices of trained groups, in training order
        self._micro: dict[str, tuple[MicroStep, int]] = {}  # cell -> (claimed micro-step, token)
        self._micro_token = 0
        self._micro_done: dict[str, int] = {}  # cell -> micro-steps completed (faster cells should do more)
        self._step_pending = False
        self._segments: list[Segment] = []
        self._last_t = 0.0
        self._steps: list[StepRecord] = []
        self.refusals: list[str] = []
        self.moves = 0
        self.move_slot_s = 0.0  # slot-seconds added by moves
        self.move_gpu_s = 0.0
        self.switches = 0
        self._ref_gpus = config.costs.reference_gpus

    # --- plumbing ------------------------------------------------------------------------------------

    def _emit(self, event: Event) -> None:
        self.seq += 1
        self.state.apply(event, self.seq)
        if self.cfg.record_events:
            self.events.append(event)
        if isinstance(event, CellRoleChanged | CellRegistered):
            self._follow_role(event)

    def _follow_role(self, event: CellRoleChanged | CellRegistered) -> None:
        """A cell arriving in rollout takes executions; one leaving moves its executions (the proxy's drain)."""
        cell = self.state.cells[event.cell_id]
        if isinstance(event, CellRegistered) or event.to_role == "rollout":
            if cell.role == "rollout":
                self._slots.open(cell.cell_id, cell.order, cell.capacity, cell.gpus)
            return
        if event.from_role == "rollout":
            for xid in self._slots.close(cell.cell_id):
                self._move(xid)

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
        while self.state.trained_step < self.loop.steps:
            if not self._heap:
                raise self._stalled(self._why_idle())
            now = self._heap[0][0]
            self._account(now)
            self.t = now
            while self._heap and self._heap[0][0] == now:
                _, _, kind, key, payload = heapq.heappop(self._heap)
                self._handle(kind, key, payload)
            self._settle()
        self._account(self.t)
        trained = self._source.groups(self._trained)
        return SimResult.build(
            policy=self.policy.name, config=self.cfg, state=self.state, steps=self._steps,
            segments=self._segments, refusals=self.refusals,
            bound=ideal_bound(self.cfg, trained, max_staleness=self.policy.staleness_bound(self.loop)),
            trained=trained, trained_groups=self._trained, lost=self._lost(),
            moves=self.moves, move_slot_s=self.move_slot_s, move_gpu_s=self.move_gpu_s,
            switches=self.switches, events=self.seq, microsteps_by_cell=self._micro_done,
        )  # fmt: skip

    def _stalled(self, reason: str) -> SimulationStalled:
        return SimulationStalled(self.policy.name, self.state.trained_step, self.loop.steps, self.t, reason)

    def _why_idle(self) -> str:
        st = self.state
        roles: dict[str, int] = {}
        for c in st.cells.values():
            roles[c.role] = roles.get(c.role, 0) + 1
        parts = [
            "no event is pending",
            f"{self._slots.busy} executions running, {len(self._queue)} queued",
            f"{st.ready_group_count} complete groups not trained, {self.packer.available} micro-steps waiting",
            "cells " + ", ".join(f"{n} {r}" for r, n in sorted(roles.items())),
        ]
        if not any(c.role in TRAINING_ROLES for c in st.cells.values()):
            parts.append("no cell is in training, so nothing can be trained")
        elif not self._slots.busy and not self._queue and st.ready_group_count == 0:
            parts.append("the policy dispatches nothing more")
        if self.refusals:
            parts.append(f"last refusal: {self.refusals[-1]}")
        return "; ".join(parts)

    def _lost(self) -> tuple[int, int, float]:
        """Groups dispatched but never trained: (finished ones, unfinished ones, their slot-seconds so far)."""
        finished = running = 0
        slot_s = 0.0
        for gid, g in self.state.groups.items():
            if g.consumed_step is not None:
                continue
            slot_s += self._gslot.get(gid, 0.0)
            if g.complete:
                finished += 1
            else:
                running += 1
        slot_s += sum(self.t - t0 for t0 in self._t0.values())
        return finished, running, slot_s

    def _handle(self, kind: int, key: str, payload: object) -> None:
        if kind == _EXEC:
            if self._token.get(key) != payload:
                return  # the execution moved: a later finish event replaced this one
            del self._token[key], self._end[key]
            t0 = self._t0.pop(key)
            self._delay.pop(key, None)
            dur = self._dur.pop(key)
            self._slots.remove(key)
            gid = key.rsplit("-", 1)[0]
            self._gslot[gid] = self._gslot.get(gid, 0.0) + self.t - t0
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
        if self._next_group + req.groups > self._max_groups:
            raise self._stalled(
                f"the policy dispatched {self._next_group} groups and asks for {req.groups} more, over "
                f"{self.cfg.max_dispatch_factor:g} x the {self.loop.steps * self.loop.groups_per_step} the run "
                "trains plus a cluster-full: it discards work faster than it trains"
            )
        version = f"v{self.state.trained_step}"
        timeout = self.cfg.workload.timeout_s
        at = self._at()
        gs = self.loop.group_size
        for g in range(req.groups):
            gid = f"s{step}-g{g}"
            self._gidx[gid] = self._next_group
            durations = self._source.group(self._next_group)
            for k in range(gs):
                xid = f"{gid}-e{k}"
                self._dur[xid] = float(durations[k])
                self._emit(
                    ExecutionDispatched(
                        execution_id=xid, task_id=f"task-s{step}-g{g}", group_id=gid, step=step,
                        weight_version=version, timeout_s=timeout, group_size=gs, occurred_at=at,
                    )
                )  # fmt: skip
                self._queue.append(xid)
            self._next_group += 1
        return True

    def _start_queued(self) -> None:
        while self._queue and self._slots.place(self._queue[0]) is not None:
            xid = self._queue.popleft()
            self._t0[xid] = self.t
            self._finish_at(xid, self.t + self._dur[xid])

    def _finish_at(self, xid: str, at: float) -> None:
        self._micro_token += 1
        self._end[xid] = at
        self._token[xid] = self._micro_token
        self._schedule(at, _EXEC, xid, self._micro_token)

    def _move(self, xid: str) -> None:
        """The proxy re-issues a running execution's call on the least-loaded engine left; it pays the move."""
        cell = self._slots.place(xid)
        if cell is None:  # the watermark rule guarantees room for every live execution
            raise RuntimeError(f"no rollout slot for moved execution {xid}: the watermark rule did not hold")
        delay = self._delay.get(xid, 0.0)
        progress = (self.t - self._t0[xid] - delay) / max(self._dur[xid], 1e-9)
        per_slot = self._slots.gpus_per_slot(cell)
        cost = self.cfg.costs.move.seconds(progress, per_slot)
        self.moves += 1
        if cost > 0:
            self._delay[xid] = delay + cost
            self.move_slot_s += cost
            self.move_gpu_s += cost * per_slot
            self._finish_at(xid, self._end[xid] + cost)

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
            for frm, to in steps[:-1]:  # leaving rollout moves the cell's executions (``_follow_role``)
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
            self._micro_token += 1
            self._micro[c.cell_id] = (m, self._micro_token)
            took = self.cfg.costs.micro_step_s * self._ref_gpus / max(c.gpus, 1) * len(m.group_ids)
            took /= self.loop.micro_groups * m.parts
            self._schedule(self.t + took, _MICRO, c.cell_id, self._micro_token)

    def _step_done(self, step: int) -> None:
        groups = self.packer.groups()
        gs = self.loop.group_size
        ids = [f"{g}-e{k}" for g in groups for k in range(gs)]
        for g in groups:
            self._trained.append(self._gidx[g])
            self._gslot.pop(g, None)
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
        busy = self._slots.busy_gpus
        self._segments.append(Segment(self._last_t, until, busy, roll - busy, train_busy, train_idle, switching + idle))
        self._last_t = until


def simulate(config: SimConfig, policy: Policy) -> SimResult:
    return Simulator(config, policy).run()
