"""The discrete-event simulator: a simulated clock drives the real policy, the real command checks and the real
state fold. Every change is an event folded through ``SchedulerState.apply``, exactly as the live service
folds the log, so a recorded run can be replayed into the SQL projection and the live path compared."""

from __future__ import annotations

import gc
import uuid
from bisect import bisect_left, insort
from collections import deque
from datetime import UTC, datetime, timedelta
from itertools import repeat
from typing import Any

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
from ._queue import EventQueue
from ._result import SimResult, StepRecord, Usage, ideal_bound
from ._slots import Slots
from ._workload import GroupDurations

__all__ = ["EPOCH", "SimulationStalled", "Simulator", "at_seconds", "simulate"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_EPOCH_US = (EPOCH - datetime(1970, 1, 1, tzinfo=UTC)) // _US


def at_seconds(t: float) -> float:
    """``as_seconds(EPOCH + timedelta(seconds=t))`` (what the fold records for an event at simulated time ``t``),
    bit for bit, without building a datetime or a timedelta: ``timedelta`` splits off the whole seconds (exact),
    scales the fraction by 10^6 (one rounding) and rounds that half to even, which is Python's ``round``; then
    one exact integer division. ``t`` is never negative (the clock starts at 0)."""
    s = int(t)
    return (_EPOCH_US + s * 1_000_000 + round((t - s) * 1e6)) / 1_000_000


_EXEC, _SWITCH, _MICRO, _STEP = 0, 1, 2, 3
# GPU series the utilisation accounting follows (see ``Usage``).
_BUSY, _ROLLOUT, _TRAIN_BUSY, _TRAINING, _OTHER = range(5)


def _category(role: str) -> int:
    return _ROLLOUT if role == "rollout" else _TRAINING if role in TRAINING_ROLES else _OTHER


class _Group:
    """One dispatched group as the simulator tracks it: where its durations come from, its members' ids (the
    training step names them again) and the slot-seconds its finished members held."""

    __slots__ = ("idx", "slot_s", "xids")

    def __init__(self, idx: int, xids: list[str]) -> None:
        self.idx, self.xids, self.slot_s = idx, xids, 0.0


class _Exec:
    """One dispatched execution as the simulator tracks it (queued, then running on a cell). Only what a
    queued execution has is set here; ``_start_queued`` sets the rest when it starts (hundreds of thousands are
    created per burst)."""

    __slots__ = ("cell", "delay", "dur", "end", "grp", "start_no", "t0", "token", "xid")
    # Set when it starts: the cell it runs on, start time, move delay so far, end, finish token, start number.
    cell: str
    t0: float
    delay: float
    end: float
    token: int
    start_no: int

    def __init__(self, xid: str, grp: _Group, dur: float) -> None:
        self.xid, self.grp, self.dur = xid, grp, dur


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
        self.state = SchedulerState(prune_trained=not config.record_events)
        self.packer = policy.packing_buffer(config.loop)
        self.t = 0.0
        self.seq = 0
        self.events: list[Event] = []
        self.decisions: list[tuple[int, float, Decision]] = []  # (seq seen, time, decision) when recording
        self._heap = EventQueue()
        self._tie = 0
        # Common random numbers: the k-th group dispatched lasts the same under every policy (for the batch loop,
        # group g of batch b is the ((b-1)*G + g)-th), drawn lazily: a policy may dispatch more than it trains.
        self._source = GroupDurations(config.workload, config.seed)
        # Room for what the run trains several times over, plus whatever fills every slot at once.
        self._max_groups = int(config.max_dispatch_factor * self.loop.steps * self.loop.groups_per_step) + (
            config.cluster.total_slots // self.loop.group_size
        )
        self._next_group = 0
        self._queue: deque[_Exec] = deque()
        self._slots: Slots[_Exec] = Slots()  # the running executions, on their cells
        self._started = 0  # executions started so far (an execution's ``start_no``)
        self._groups: dict[str, _Group] = {}  # every dispatched group
        self._trained: list[int] = []  # indices of trained groups, in training order
        self._micro: dict[str, tuple[MicroStep, int]] = {}  # cell -> (claimed micro-step, token)
        self._idle: list[tuple[int, int, str]] = []  # training cells without a micro-step: (-gpus, order, id)
        self._micro_token = 0
        self._micro_done: dict[str, int] = {}  # cell -> micro-steps completed (faster cells should do more)
        self._step_pending = False
        self._usage = Usage()
        self._id_prefix = uuid.uuid4().hex[:16]  # event ids: unique per run, no uuid per event
        self._at_t, self._at_v, self._at_s = -1.0, EPOCH, 0.0
        self._steps: list[StepRecord] = []
        self.refusals: list[str] = []
        self.moves = 0
        self.move_slot_s = 0.0  # slot-seconds added by moves
        self.move_gpu_s = 0.0
        self.switches = 0
        self._ref_gpus = config.costs.reference_gpus
        self._record = config.record_events
        self._view = View(self.state, 0.0, self.loop)

    # --- plumbing ------------------------------------------------------------------------------------

    def _eid(self) -> str:
        """The id of the next event emitted."""
        return f"{self._id_prefix}{self.seq + 1:016x}"

    def _emit(self, event: Event) -> None:
        self.seq += 1
        self.state.apply(event, self.seq)
        if self.cfg.record_events:
            self.events.append(event)
        if isinstance(event, CellRoleChanged | CellRegistered):
            self._follow_role(event)

    def _follow_role(self, event: CellRoleChanged | CellRegistered) -> None:
        """A cell arriving in rollout takes executions; one leaving moves its executions (the proxy's drain).
        A cell arriving in training waits for micro-steps; one leaving training no longer does."""
        cell = self.state.cells[event.cell_id]
        if isinstance(event, CellRegistered):
            self._usage.jump(_category(event.role), self.t, cell.gpus)
        elif (old := _category(event.from_role)) != (new := _category(event.to_role)):
            self._usage.jump(old, self.t, -cell.gpus)
            self._usage.jump(new, self.t, cell.gpus)
        if isinstance(event, CellRegistered) or event.to_role == "rollout":
            if cell.role == "rollout":
                self._slots.open(cell.cell_id, cell.order, cell.capacity, cell.gpus)
            return
        if event.from_role == "rollout":
            moved = self._slots.close(cell.cell_id)
            self._usage.jump(_BUSY, self.t, -len(moved) * cell.gpus / max(cell.capacity, 1))
            for x in moved:
                self._move(x)
        was, now = event.from_role in TRAINING_ROLES, event.to_role in TRAINING_ROLES
        if now and not was:
            insort(self._idle, (-cell.gpus, cell.order, cell.cell_id))
        elif was and not now:
            key = (-cell.gpus, cell.order, cell.cell_id)
            i = bisect_left(self._idle, key)
            if i < len(self._idle) and self._idle[i] == key:
                del self._idle[i]

    def _at(self) -> datetime:
        if self.t != self._at_t:
            self._at_t, self._at_v = self.t, EPOCH + timedelta(seconds=self.t)
            self._at_s = at_seconds(self.t)
        return self._at_v

    def _schedule(self, at: float, kind: int, key: str, payload: object = None) -> None:
        self._tie += 1
        self._heap.push((at, self._tie, kind, key, payload))

    # --- the run -------------------------------------------------------------------------------------

    def run(self) -> SimResult:
        # A large run holds millions of small objects (executions, groups, queued events) and makes no reference
        # cycles worth collecting: the cyclic collector would walk them again and again (a fifth of the run's
        # time at 512 cells). Paused for the run and restored after it.
        paused = gc.isenabled()
        gc.disable()
        try:
            return self._run()
        finally:
            if paused:
                gc.enable()

    def _run(self) -> SimResult:
        cl = self.cfg.cluster
        for i in range(cl.cells + cl.resident_cells):
            resident = i >= cl.cells
            self._emit(
                CellRegistered(
                    cell_id=f"{'pool' if resident else 'cell'}{i}", node=f"nodes{i * cl.nodes_per_cell}",
                    gpus=cl.gpus_of(i), capacity=cl.slots_per_cell, role="rollout", resident=resident,
                    event_id=self._eid(), occurred_at=self._at(),
                )
            )  # fmt: skip
        self._settle()
        heap, state, steps = self._heap, self.state, self.loop.steps
        pop, pop_at = heap.pop, heap.pop_at
        finish, handle, settle = self._finish, self._handle, self._settle
        while state.trained_step < steps:
            if not heap:
                raise self._stalled(self._why_idle())
            first = pop()
            now = self.t = first[0]
            entry: tuple[float, int, int, Any, Any] | None = first
            while entry is not None:  # every event of this instant, then the policy once
                _, _, kind, key, payload = entry
                if kind == _EXEC:  # most events: keep their path short
                    finish(key, payload)
                else:
                    handle(kind, key, payload)
                entry = pop_at(now)
            settle()
        trained = self._source.groups(self._trained)
        return SimResult.build(
            policy=self.policy.name, config=self.cfg, state=self.state, steps=self._steps,
            usage=self._usage, refusals=self.refusals,
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
            slot_s += self._groups[gid].slot_s
            if g.complete:
                finished += 1
            else:
                running += 1
        # In start order, so the float sum is the same whichever cells they ended up on.
        slot_s += sum(self.t - x.t0 for x in sorted(self._slots.placed(), key=lambda x: x.start_no))
        return finished, running, slot_s

    def _finish(self, x: _Exec, token: int) -> None:
        if x.token != token:
            return  # the execution moved: a later finish event replaced this one
        key = x.xid
        t = self.t
        self._usage.jump(_BUSY, t, -self._slots.remove(x, x.cell))
        grp = x.grp
        grp.slot_s = grp.slot_s + t - x.t0
        if self._record:
            timed_out = x.dur >= self.cfg.workload.timeout_s
            self._emit(
                ExecutionFinished(
                    execution_id=key, status="timed-out" if timed_out else "completed",
                    score=0.0 if timed_out else 1.0, event_id=self._eid(), occurred_at=self._at(),
                )
            )  # fmt: skip
        else:  # the same fold, without building the event nobody keeps (a long run has millions)
            self.seq += 1
            st = self.state
            st.finish_execution(key, True, at_seconds(t))
            st.last_seq = self.seq

    def _handle(self, kind: int, key: str, payload: object) -> None:
        if kind == _SWITCH:
            self._switch_done(key, str(payload))
        elif kind == _MICRO:
            held = self._micro.get(key)
            if held is None or held[1] != payload:
                return  # the cell left training; the micro-step went back to the buffer
            del self._micro[key]
            cell = self.state.cells[key]
            self._usage.jump(_TRAIN_BUSY, self.t, -cell.gpus)
            insort(self._idle, (-cell.gpus, cell.order, key))
            self._micro_done[key] = self._micro_done.get(key, 0) + 1
            if self.packer.complete(held[0]):
                self._step_pending = True
                self._schedule(self.t + self.cfg.costs.step_overhead_s, _STEP, str(held[0].step))
        elif kind == _STEP:
            self._step_done(int(key))

    def _settle(self) -> None:
        """Let the policy act on this instant until it has nothing more to say, then fill slots and trainers."""
        view = self._view
        view.now = self.t  # one view, moved to this instant (policies keep nothing of it)
        for _ in range(16):
            if self._queue:
                self._start_queued()
            d = self.policy.decide(view)
            if not (d.roles or d.dispatch):
                break  # the common case: nothing to do now
            if self.cfg.record_events:
                self.decisions.append((self.seq, self.t, d))
            changed = False
            for r in d.roles:  # roles first: a fixed split or a drain is judged on the watermark before the burst
                changed |= self._request(r)
            for req in d.dispatch:
                changed |= self._dispatch(req)
            if not changed:
                break
        if self._queue:
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
        at_s = self._at_s
        gs = self.loop.group_size
        record = self.cfg.record_events
        st = self.state
        queue, groups = self._queue, self._groups
        for g in range(req.groups):
            gid = f"s{step}-g{g}"
            durs = self._source.group(self._next_group).tolist()
            xids = [f"{gid}-e{k}" for k in range(len(durs))]
            grp = groups[gid] = _Group(self._next_group, xids)
            if record:
                for xid in xids:
                    self._emit(
                        ExecutionDispatched(
                            execution_id=xid, task_id=f"task-s{step}-g{g}", group_id=gid, step=step,
                            weight_version=version, timeout_s=timeout, group_size=gs, event_id=self._eid(),
                            occurred_at=at,
                        )
                    )  # fmt: skip
            else:  # the same fold (one call for the group's members), without building the events
                self.seq += len(xids)
                st.dispatch_group(xids, gid, step, version, at_s, timeout, gs)
            queue.extend(map(_Exec, xids, repeat(grp), durs))
            self._next_group += 1
        st.last_seq = self.seq
        return True

    def _start_queued(self) -> None:
        queue, slots, heap, t = self._queue, self._slots, self._heap, self.t
        jump = self._usage.jump
        while queue:
            x = queue[0]
            cell = slots.place(x)
            if cell is None:
                return
            queue.popleft()
            jump(_BUSY, t, slots.gpus_per_slot(cell))
            x.t0, x.cell, x.delay = t, cell, 0.0
            x.start_no = self._started = self._started + 1
            # ``_finish_at``, inlined: a burst starts hundreds of thousands
            self._micro_token += 1
            x.end, x.token = end, token = t + x.dur, self._micro_token
            self._tie += 1
            heap.push((end, self._tie, _EXEC, x, token))

    def _finish_at(self, x: _Exec, at: float) -> None:
        self._micro_token += 1
        x.end, x.token = at, self._micro_token
        self._tie += 1
        self._heap.push((at, self._tie, _EXEC, x, self._micro_token))

    def _move(self, x: _Exec) -> None:
        """The proxy re-issues a running execution's call on the least-loaded engine left; it pays the move."""
        cell = self._slots.place(x)
        if cell is None:  # the watermark rule guarantees room for every live execution
            raise RuntimeError(f"no rollout slot for moved execution {x.xid}: the watermark rule did not hold")
        x.cell = cell
        per_slot = self._slots.gpus_per_slot(cell)
        self._usage.jump(_BUSY, self.t, per_slot)  # ``_follow_role`` took it off the old cell's GPUs
        progress = (self.t - x.t0 - x.delay) / max(x.dur, 1e-9)
        cost = self.cfg.costs.move.seconds(progress, per_slot)
        self.moves += 1
        if cost > 0:
            x.delay += cost
            self.move_slot_s += cost
            self.move_gpu_s += cost * per_slot
            self._finish_at(x, x.end + cost)

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
                                           event_id=self._eid(), occurred_at=at))  # fmt: skip
            self._schedule(self.t + self.cfg.costs.to_training_s, _SWITCH, req.cell_id, "training")
            return True
        if cell.role in TRAINING_ROLES:
            held = self._micro.pop(req.cell_id, None)
            if held is not None:
                self.packer.release(held[0])
                self._usage.jump(_TRAIN_BUSY, self.t, -cell.gpus)
            if cell.role == "training-core":
                heir = core_heir(self.state)
                if heir is not None:  # the authoritative weights and optimizer state move before the core leaves
                    self._emit(
                        CellRoleChanged(
                            cell_id=heir.cell_id, from_role="training-satellite", to_role="training-core",
                            reason="core hand-over", event_id=self._eid(), occurred_at=at,
                        )
                    )  # fmt: skip
        for frm, to in steps:
            if to == "rollout" and frm == "switching":
                self._schedule(self.t + self.cfg.costs.to_rollout_s, _SWITCH, req.cell_id, "rollout")
                return True
            self._emit(CellRoleChanged(cell_id=req.cell_id, from_role=frm, to_role=to, reason=req.reason,
                                       event_id=self._eid(), occurred_at=at))  # fmt: skip
        return True

    def _switch_done(self, cell_id: str, target: str) -> None:
        to = arrival_role(self.state) if target == "training" else "rollout"
        why = "trainer worker up" if target == "training" else "engine up"
        self._emit(CellRoleChanged(cell_id=cell_id, from_role="switching", to_role=to, reason=why,
                                   event_id=self._eid(), occurred_at=self._at()))  # fmt: skip

    # --- training ------------------------------------------------------------------------------------

    def _train(self) -> None:
        if self._step_pending:
            return
        self.packer.sync(self.state)
        if not self.packer.available:
            return
        if not self.state.core_count:
            return  # nobody holds the authoritative weights yet
        # Faster cells first (then registration order): with unequal cells they claim more and the step ends
        # together. ``_idle`` holds the training cells without a micro-step in exactly that order.
        while self._idle:
            neg_gpus, _, cell_id = self._idle[0]
            m = self.packer.claim(cell_id)
            if m is None:
                return
            del self._idle[0]
            self._micro_token += 1
            self._micro[cell_id] = (m, self._micro_token)
            self._usage.jump(_TRAIN_BUSY, self.t, -neg_gpus)
            took = self.cfg.costs.micro_step_s * self._ref_gpus / max(-neg_gpus, 1) * len(m.group_ids)
            took /= self.loop.micro_groups * m.parts
            self._schedule(self.t + took, _MICRO, cell_id, self._micro_token)

    def _step_done(self, step: int) -> None:
        groups = [self._groups.pop(g) for g in self.packer.groups()]  # trained: nothing more to follow
        ids = [xid for g in groups for xid in g.xids]
        self._trained.extend(g.idx for g in groups)
        before = dict(self.state.staleness_hist)
        self._emit(
            TrainingStepCompleted(
                step=step, weight_version=f"v{step}", loss=0.0, n_samples=len(ids), n_tokens=0, execution_ids=ids,
                event_id=self._eid(), occurred_at=self._at(),
            )
        )  # fmt: skip
        stale = {k: v - before.get(k, 0) for k, v in self.state.staleness_hist.items() if v - before.get(k, 0)}
        n = sum(stale.values())
        self._steps.append(
            StepRecord(step, self.t, sum(k * v for k, v in stale.items()) / n if n else 0.0, max(stale, default=0))
        )
        self._step_pending = False


def simulate(config: SimConfig, policy: Policy) -> SimResult:
    return Simulator(config, policy).run()
