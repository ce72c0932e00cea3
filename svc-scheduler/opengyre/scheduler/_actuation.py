"""The role-change protocol, carried out: each step done by the actuator, then recorded as an event, so a replay
shows exactly what happened and in which order.

To training: ``rollout -> draining`` (the proxy stops routing to the engine on this event), the actuator drains
(in-flight requests aborted and rerouted, confirmed by the proxy) and releases the engine, ``draining ->
switching``, the trainer worker starts, ``switching -> training-core|satellite``. Back: the core hands over to
a satellite if one stays, ``training-* -> switching``, the trainer stops, the engine starts, ``switching ->
rollout`` with the engine's URL (the proxy adds it back).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

from opengyre.events import CellRole, CellRoleChanged

from ._commands import arrival_role, core_heir
from ._policy import Target
from ._rules import TRAINING_ROLES
from ._state import CellState, SchedulerState
from .actuators import Actuator

__all__ = ["Append", "Membership", "RoleChanger", "StateSource"]

# Append one event; returns its stream sequence once stored (and folded into the state the source reads).
Append = Callable[[CellRoleChanged], Awaitable[int]]
StateSource = Callable[[], Awaitable[SchedulerState]]


@dataclass
class Membership:
    """Who trains, and which cell holds the authoritative weights and optimizer state (the core), shared by
    every role change under way. Several run at once (a policy moves a whole pool), so a cell's arrival role
    and a core's hand-over are decided on the state as it is at that moment, under this lock; a cell starting
    its trainer as the core keeps that place until it arrives. One core, and no step appended on a stale role.
    """

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    arriving_core: str | None = None


@dataclass
class RoleChanger:
    actuator: Actuator
    append: Append
    state: StateSource
    # Called with the cell's id once its trainer worker is stopped: nothing can claim for the cell any more,
    # so its unfinished micro-step goes back to the buffer.
    trainer_stopped: Callable[[str], Awaitable[None]] | None = None
    membership: Membership = field(default_factory=Membership)
    steps: list[str] = field(default_factory=list)

    async def _step(self, cell: CellState, frm: CellRole, to: CellRole, reason: str, url: str | None = None) -> None:
        await self.append(
            CellRoleChanged(cell_id=cell.cell_id, from_role=frm, to_role=to, reason=reason, engine_url=url)
        )
        self.steps.append(f"{cell.cell_id}: {frm}->{to}")
        cell.role = to

    async def begin_drain(self, cell: CellState, reason: str) -> None:
        """The first step, which takes the cell's capacity out of CR(t). The caller checked the watermark rule
        and holds its command lock until this event is folded, so no other command sees stale capacity."""
        await self._step(cell, "rollout", "draining", f"stop routing: {reason}")

    async def finish_drain(self, cell: CellState, then: CellRole = "switching") -> None:
        moved = await self.actuator.drain(cell)
        await self.actuator.release_engine(cell)
        await self._step(cell, "draining", then, f"drained: {moved} request(s) rerouted; engine released")

    async def to_training(self, cell: CellState, reason: str) -> None:
        if cell.role == "rollout":
            await self.begin_drain(cell, reason)
        if cell.role == "draining":
            await self.finish_drain(cell)
        elif cell.role == "idle":
            await self._step(cell, "idle", "switching", reason)
        m = self.membership
        async with m.lock:
            core = arrival_role(await self.state()) == "training-core" and m.arriving_core is None
            if core:
                m.arriving_core = cell.cell_id
        try:
            await self.actuator.start_trainer(cell, core=core)
            async with m.lock:
                await self._step(
                    cell, "switching", "training-core" if core else "training-satellite", "trainer worker up"
                )
        finally:
            if core:
                m.arriving_core = None

    async def to_rollout(self, cell: CellState, reason: str) -> None:
        if cell.role in ("idle", "draining"):
            # A cancelled drain keeps its engine; a parked cell needs one again.
            url = await self.actuator.start_engine(cell) if cell.role == "idle" else None
            await self._step(cell, cell.role, "rollout", reason, url)
            return
        if cell.role in TRAINING_ROLES:
            await self._leave_training(cell, reason)
        await self.actuator.stop_trainer(cell)  # also after a to-training switch that stopped half-way
        if self.trainer_stopped is not None:
            await self.trainer_stopped(cell.cell_id)
        url = await self.actuator.start_engine(cell)
        await self._step(cell, "switching", "rollout", "engine up", url)

    async def _leave_training(self, cell: CellState, reason: str) -> None:
        async with self.membership.lock:
            st = await self.state()
            cell.role = st.cells[cell.cell_id].role  # a core that left meanwhile may have made it the core
            if cell.role == "training-core":
                heir = core_heir(st)
                if heir is not None:  # the authoritative weights and optimizer state move before the core leaves
                    # A copy: ``_step`` records the role on the cell it is given, and the state is shared.
                    await self._step(
                        replace(heir), "training-satellite", "training-core", f"core hand-over from {cell.cell_id}"
                    )
            await self._step(cell, cell.role, "switching", reason)

    async def to_idle(self, cell: CellState, reason: str) -> None:
        """Manual drain: out of rollout and parked (the caller checked the watermark rule)."""
        if cell.role == "rollout":
            await self.begin_drain(cell, reason)
        await self.finish_drain(cell, "idle")

    async def run(self, cell: CellState, target: Target, reason: str) -> None:
        if target == "training":
            await self.to_training(cell, reason)
        else:
            await self.to_rollout(cell, reason)
