"""The live scheduler: reads the projection, asks the policy, and carries out role changes through the command
checks and the actuator; hands out micro-steps. One asyncio lock makes check-then-act atomic: the first event
of a change is folded before the next command is judged."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace

from sqlalchemy import Engine, func, select

from opengyre.eventlog import ConcurrencyError, EventLog
from opengyre.events import CellEngineChanged, CellRegistered, CellRoleChanged, Event

from ._actuation import Membership, RoleChanger
from ._commands import CommandRefused, check_drain, check_engine_url, check_registration, check_role_request
from ._dispatch import GroupAsk, check_asks, plan_dispatch
from ._executions import EXECUTIONS
from ._packing import MicroStep
from ._policy import Decision, LoopConfig, Policy, RoleRequest, View
from ._projection import SchedulerProjection, load_state
from ._rules import TRAINING_ROLES
from ._state import CellState, SchedulerState
from .actuators import Actuator

__all__ = ["Claim", "Dispatch", "RoleChangeOutcome", "SchedulerController"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claim:
    micro: MicroStep
    execution_ids: tuple[str, ...]


@dataclass(frozen=True)
class Dispatch:
    """The groups' members as placed (those of a group dispatched before included), and the last seq appended."""

    step: int
    weight_version: str
    members: tuple[tuple[str, str, str, int, str], ...]  # (execution, group, task, task version, cell)
    seq: int


@dataclass
class RoleChangeOutcome:
    cell: CellState
    steps: list[str] = field(default_factory=list)


class SchedulerController:
    def __init__(
        self,
        *,
        engine: Engine,
        log: EventLog,
        policy: Policy,
        loop: LoopConfig,
        actuator: Actuator,
        auto: bool = False,
        poll_s: float = 0.25,
        projection: str = SchedulerProjection.name,
        caught_up: Callable[[], Awaitable[None]] | None = None,
        applied: Callable[[int], Awaitable[None]] | None = None,
        positions: Callable[[], AsyncIterator[int]] | None = None,
        committed: Callable[[], int] | None = None,
    ) -> None:
        self.engine = engine
        self.log = log
        self.policy = policy
        self.loop = loop
        self.actuator = actuator
        self.auto = auto
        self.poll_s = poll_s
        self.projection = projection
        self._caught_up = caught_up
        self._applied = applied  # the live runner's ``applied``: awaited, not polled
        self._positions = positions  # the live runner's ``positions``: a tick on each fold, not only each poll_s
        # The live runner's committed position (-1 before it has read it): the loaded state is kept until the
        # projection moves past it, so an idle scheduler loads nothing (a load is O(history), see ``state``).
        self._committed = committed
        self._cache: tuple[int, SchedulerState] | None = None
        self.ticks = 0
        self._wake = asyncio.Event()  # the policy loop's: a fold, or a role change ending, may change its advice
        self.packer = policy.packing_buffer(loop)
        self.advice = Decision()
        self._lock = asyncio.Lock()
        self._claim_lock = asyncio.Lock()
        self._membership = Membership()
        self._busy: set[str] = set()
        self._claims: dict[str, Claim] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    # --- reading -------------------------------------------------------------------------------------

    def _load(self) -> SchedulerState:
        with self.engine.connect() as conn:
            return load_state(conn, self.projection, full=False)

    async def state(self) -> SchedulerState:
        """The projection's state. With a live runner in this process it is loaded once per committed position
        and shared until the projection moves (the load reads every group and scans the executions ledger, so
        a loop, a watcher and the commands re-reading it while nothing happens cost O(history) each time).
        Readers must not modify it. Without a live runner (another process folds) every call loads."""
        at = self._committed() if self._committed is not None else -1
        cached = self._cache
        if at >= 0 and cached is not None and cached[0] == at:
            return cached[1]
        # Read ``at`` before the load: the rows hold at least that position, and a fold committed during the
        # load moves the position, so the next call loads again.
        st = await asyncio.to_thread(self._load)
        if at >= 0 and (self._cache is None or self._cache[0] <= at):
            self._cache = (at, st)
        return st

    async def states(self) -> AsyncIterator[SchedulerState]:
        """The state now, then again each time the projection commits (a watcher reads nothing while the log is
        still); without a live runner, or once it ended, every ``poll_s``."""
        if self._positions is not None:
            async for _ in self._positions():
                yield await self.state()
        while True:
            yield await self.state()
            await asyncio.sleep(self.poll_s)

    async def fresh_state(self) -> SchedulerState:
        """The state once the projection has folded everything on the log so far: commands are judged on it,
        so an execution dispatched a moment ago counts in w(t) before a cell may leave rollout."""
        if self._caught_up is not None:
            await self._caught_up()
        return await self.state()

    def _applier(self) -> Callable[[int], Awaitable[None]]:
        """The live runner's ``applied``, asked for before a command appends anything: a command waits for its
        append through it, and a controller without one (no runner in this process) refuses the command with
        nothing appended instead of polling the tracking rows for another process's fold."""
        if self._applied is None:
            raise CommandRefused(
                "failed-precondition",
                f"no live runner of projection {self.projection} in this process: commands need one",
            )
        return self._applied

    async def wait_applied(self, seq: int, timeout: float = 30.0) -> None:
        """Wait until the projection has folded stream sequence ``seq`` (the live runner's ``applied``)."""
        await asyncio.wait_for(self._applier()(seq), timeout)

    async def append(self, event: Event, *, expected: int | None = None) -> int:
        applied = self._applier()
        ack = await self.log.append(event, expected_last_subject_seq=expected)
        await asyncio.wait_for(applied(ack.seq), 30.0)
        return ack.seq

    async def _append_role(self, event: CellRoleChanged) -> int:
        """Append on the cell's stream position as the projection last folded it: a change someone else made
        to the cell since (another scheduler, an operator's tool) refuses this one instead of being overrun."""
        cell = (await self.state()).cells.get(event.cell_id)
        if cell is None:
            raise CommandRefused("not-found", f"cell {event.cell_id} is not registered")
        try:
            return await self.append(event, expected=cell.role_seq)
        except ConcurrencyError as exc:
            raise CommandRefused(
                "failed-precondition",
                f"cell {event.cell_id} changed since it was read at stream seq {cell.role_seq}; nothing appended",
            ) from exc

    def _changer(self) -> RoleChanger:
        return RoleChanger(self.actuator, self._append_role, self.state, self.release_claims, self._membership)

    # --- commands ------------------------------------------------------------------------------------

    async def register(self, event: CellRegistered) -> CellState:
        async with self._lock:
            check_registration(await self.fresh_state(), event)
            try:
                await self.append(event, expected=0)  # 0: no event for this cell yet, even from a racing writer
            except ConcurrencyError as exc:
                raise CommandRefused("already-exists", f"cell {event.cell_id} is already registered") from exc
            return (await self.state()).cells[event.cell_id]

    async def change_engine(self, event: CellEngineChanged) -> CellState:
        """Point a registered cell at another engine; the same URL again appends nothing."""
        async with self._lock:
            cell = (await self.fresh_state()).cells.get(event.cell_id)
            if cell is None:
                raise CommandRefused("not-found", f"cell {event.cell_id} is not registered")
            check_engine_url(event.cell_id, event.engine_url)
            if event.cell_id in self._busy:
                raise CommandRefused("failed-precondition", f"a role change of cell {event.cell_id} is in progress")
            if cell.engine_url == event.engine_url:
                return cell
            try:  # on the cell's position as last folded: a role change appended meanwhile refuses this one
                await self.append(event, expected=cell.role_seq)
            except ConcurrencyError as exc:
                raise CommandRefused(
                    "failed-precondition", f"cell {event.cell_id} changed meanwhile; nothing appended"
                ) from exc
            return (await self.state()).cells[event.cell_id]

    async def change_role(self, req: RoleRequest) -> RoleChangeOutcome:
        """Run the whole protocol for one cell; refused (nothing changes) when the checks fail."""
        changer = self._changer()
        async with self._lock:
            st = await self.fresh_state()
            if req.cell_id in self._busy:
                raise CommandRefused("failed-precondition", f"a role change of cell {req.cell_id} is in progress")
            check_role_request(st, req)
            cell = replace(st.cells[req.cell_id])  # the changer's own copy: the state is shared (see ``state``)
            self._busy.add(req.cell_id)
            try:
                if req.target == "training" and cell.role == "rollout":
                    await changer.begin_drain(cell, req.reason)
            except BaseException:
                self._done_with(req.cell_id)
                raise
        try:
            await changer.run(cell, req.target, req.reason)
        finally:
            self._done_with(req.cell_id)
        return RoleChangeOutcome((await self.state()).cells[req.cell_id], changer.steps)

    async def drain_cell(self, cell_id: str, reason: str) -> RoleChangeOutcome:
        """Operator's drain: take a rollout cell out of service, under the same watermark rule."""
        changer = self._changer()
        async with self._lock:
            st = await self.fresh_state()
            if cell_id in self._busy:
                raise CommandRefused("failed-precondition", f"a role change of cell {cell_id} is in progress")
            check_drain(st, cell_id)
            cell = replace(st.cells[cell_id])  # the changer's own copy: the state is shared (see ``state``)
            self._busy.add(cell_id)
            try:
                await changer.begin_drain(cell, reason)
            except BaseException:
                self._done_with(cell_id)
                raise
        try:
            await changer.to_idle(cell, reason)
        finally:
            self._done_with(cell_id)
        return RoleChangeOutcome((await self.state()).cells[cell_id], changer.steps)

    def _done_with(self, cell_id: str) -> None:
        """The cell's role change ended: the policy loop looks again (a tick while it was busy skipped it)."""
        self._busy.discard(cell_id)
        self._wake.set()

    # --- dispatch ------------------------------------------------------------------------------------

    def _running_by_cell(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            q = (
                select(EXECUTIONS.c.cell_id, func.count())
                .where(EXECUTIONS.c.status == "running", EXECUTIONS.c.cell_id.is_not(None))
                .group_by(EXECUTIONS.c.cell_id)
            )
            return {str(cell): int(n) for cell, n in conn.execute(q)}

    def _members(self, group_ids: Sequence[str]) -> list[tuple[str, str, str, str, int, str]]:
        """(execution, group, task, cell, step, weight version) of the groups' members, in dispatch order."""
        x = EXECUTIONS.c
        q = (
            select(x.execution_id, x.group_id, x.task_id, x.cell_id, x.step, x.weight_version)
            .where(x.group_id.in_(list(group_ids)))
            .order_by(x.dispatched_seq)
        )
        with self.engine.connect() as conn:
            return [(r[0], r[1], r[2], r[3] or "", int(r[4]), str(r[5])) for r in conn.execute(q)]

    async def dispatch(self, asks: Sequence[GroupAsk], timeout_s: float) -> Dispatch:
        """Place new groups on rollout cells (under the lock: no cell starts draining between check and append)
        and append their ``execution-dispatched``; groups already dispatched are answered as they were placed."""
        check_asks(asks)
        if not math.isfinite(timeout_s) or timeout_s <= 0:
            # A NaN would reach the event as null, which every projection refuses (dead-letters).
            raise CommandRefused("invalid-argument", f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        async with self._lock:
            st = await self.fresh_state()
            new = [a for a in asks if a.group_id not in st.groups]
            seq = 0
            if new:
                running = await asyncio.to_thread(self._running_by_cell)
                advice = self.policy.decide(View(st, time.time(), self.loop))
                placed = plan_dispatch(st, advice, self.loop, new, running, timeout_s)
                self._applier()  # refused here, before anything is appended
                acks = await self.log.append_many(placed.events)
                seq = acks[-1].seq
                await self.wait_applied(seq)
            rows = await asyncio.to_thread(self._members, [a.group_id for a in asks])
        versions = {a.group_id: a.task_version for a in asks}
        members = tuple((e, g, t, versions[g], c) for e, g, t, c, _, _ in rows)
        step, version = (rows[-1][4], rows[-1][5]) if rows else (0, "default")
        return Dispatch(step, version, members, seq)

    # --- streaming training --------------------------------------------------------------------------

    def _execution_ids(self, group_ids: Sequence[str]) -> tuple[str, ...]:
        if not group_ids:
            return ()
        with self.engine.connect() as conn:
            q = (
                select(EXECUTIONS.c.execution_id)
                .where(EXECUTIONS.c.group_id.in_(list(group_ids)))
                .order_by(EXECUTIONS.c.group_id, EXECUTIONS.c.execution_id)
            )
            return tuple(conn.execute(q).scalars())

    async def claim(self, cell_id: str) -> Claim | None:
        """Atomically hand the cell the next micro-step (or its unfinished one again, after a worker restart)."""
        async with self._claim_lock:
            st = await self.state()
            cell = st.cells.get(cell_id)
            if cell is None:
                raise CommandRefused("not-found", f"cell {cell_id} is not registered")
            if cell.role not in TRAINING_ROLES:
                raise CommandRefused("failed-precondition", f"cell {cell_id} is {cell.role}, not training")
            self.packer.sync(st)
            held = self._claims.get(cell_id)
            if held is not None and held.micro.step == self.packer.step:
                return held
            m = self.packer.claim(cell_id)
            if m is None:
                return None
            claim = Claim(m, m.select(await asyncio.to_thread(self._execution_ids, m.group_ids)))
            self._claims[cell_id] = claim
            return claim

    async def complete(self, cell_id: str, step: int, index: int) -> tuple[bool, tuple[str, ...]]:
        async with self._claim_lock:
            held = self._claims.get(cell_id)
            if held is None or (held.micro.step, held.micro.index) != (step, index):
                raise CommandRefused("failed-precondition", f"cell {cell_id} holds no micro-step {step}/{index}")
            del self._claims[cell_id]
            if not self.packer.complete(held.micro):
                return False, ()
            return True, await asyncio.to_thread(self._execution_ids, self.packer.groups())

    async def release_claims(self, cell_id: str) -> None:
        """The cell's worker is gone (its cell left training): its unfinished micro-step goes back to the buffer.
        Not before: until the cell is out of training its worker may claim again."""
        async with self._claim_lock:
            held = self._claims.pop(cell_id, None)
            if held is not None:
                self.packer.release(held.micro)

    # --- the policy loop -----------------------------------------------------------------------------

    async def tick(self) -> Decision:
        self.ticks += 1
        st = await self.state()
        decision = self.policy.decide(View(st, time.time(), self.loop))
        self.advice = decision
        if self.auto:
            for req in decision.roles:
                if req.cell_id not in self._busy:
                    task = asyncio.create_task(self._carry_out(req), name=f"role-{req.cell_id}")
                    self._tasks.add(task)
                    task.add_done_callback(self._tasks.discard)
        return decision

    async def _carry_out(self, req: RoleRequest) -> None:
        try:
            await self.change_role(req)
        except CommandRefused as exc:
            log.info("policy %s: %s -> %s refused: %s", self.policy.name, req.cell_id, req.target, exc.message)
        except Exception:
            log.exception("role change %s -> %s failed", req.cell_id, req.target)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick at once whenever the projection commits (a group ready, a cell moved) or a role change ends:
        the advice is a function of the state and of the cells busy changing, so nothing else changes it.
        ``poll_s`` is the fallback (a failed tick, a controller without a live runner): ticking only every
        ``poll_s`` let a trainer train a ready step before the policy saw it, and an idle loop has no work."""
        wake = self._wake

        async def follow(positions: AsyncIterator[int]) -> None:
            async for _ in positions:
                wake.set()

        async def stopped() -> None:
            await stop.wait()
            wake.set()

        helpers = [asyncio.create_task(stopped())]
        if self._positions is not None:
            helpers.append(asyncio.create_task(follow(self._positions())))
        try:
            while not stop.is_set():
                wake.clear()  # before the tick: a fold during it wakes the next one
                try:
                    await self.tick()
                except Exception:
                    log.exception("scheduler tick failed")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), self.poll_s)
        finally:
            for t in helpers:
                t.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.actuator.close()
