"""The interface every scheduling policy implements, and the few facts all of them read the same way.

A policy is a pure function of the scheduler state (the fold of the log) and the clock: it proposes role
changes and which training steps' rollouts may be dispatched. It never performs anything; the command layer
checks each proposal against the watermark rule and the actuator carries it out, one event per protocol step.
The simulator and the live service call the very same ``decide``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

from ._loop import LoopConfig, Packing
from ._packing import PackingBuffer, StaleMode
from ._rules import TRAINING_ROLES
from ._state import CellState, SchedulerState

__all__ = [
    "Decision",
    "DispatchRequest",
    "LoopConfig",
    "Packing",
    "Policy",
    "RoleRequest",
    "Target",
    "View",
    "dispatchable",
    "heading_to_rollout",
    "heading_to_training",
    "ready_microsteps",
]

Target = Literal["training", "rollout"]


@dataclass(frozen=True, slots=True)
class RoleRequest:
    cell_id: str
    target: Target
    reason: str


@dataclass(frozen=True, slots=True)
class DispatchRequest:
    """Start ``groups`` new groups now, labelled with training step ``step`` (the batch they are meant for)."""

    step: int
    groups: int


@dataclass(frozen=True, slots=True)
class Decision:
    roles: tuple[RoleRequest, ...] = ()
    dispatch: tuple[DispatchRequest, ...] = ()

    @property
    def dispatched_groups(self) -> int:
        return sum(d.groups for d in self.dispatch)

    def __bool__(self) -> bool:
        return bool(self.roles or self.dispatch)


# The empty decision, shared: it is most of what a policy answers, and the simulator asks after every instant.
NOTHING = Decision()


def dispatch_only(dispatch: tuple[DispatchRequest, ...]) -> Decision:
    """Start these batches, change no role (the shared empty decision when there is none to start)."""
    return Decision((), dispatch) if dispatch else NOTHING


@dataclass(slots=True)
class View:
    """What a policy decides on. Read-only by convention, not frozen: a frozen dataclass costs three times as
    much to build, and the simulator builds one per instant (hundreds of millions in a large run)."""

    state: SchedulerState
    now: float
    loop: LoopConfig


class Policy(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]
    packing: ClassVar[Packing] = "batch"
    # Streaming: micro-steps are handed out as groups complete; otherwise only once the step's batch is whole.
    streaming: ClassVar[bool] = True

    def validate(self, loop: LoopConfig) -> None:  # noqa: B027 (most policies accept every loop)
        """Raise ValueError when this policy's parameters cannot serve ``loop``."""

    def staleness_cap(self, loop: LoopConfig) -> int | None:
        """fifo packing: no sample trained staler than this (None: the dispatch bound alone limits staleness)."""
        return None

    def stale_mode(self) -> StaleMode:
        """fifo packing with a cap: a group due by the cap is waited for ("wait") or given up ("drop")."""
        return "wait"

    def staleness_bound(self, loop: LoopConfig) -> int | None:
        """The most versions stale any sample this policy trains can be (None: no bound)."""
        return loop.max_lag if self.packing == "batch" else self.staleness_cap(loop)

    def packing_buffer(self, loop: LoopConfig) -> PackingBuffer:
        """The packing buffer this policy's training reads from (the simulator and the live service alike)."""
        return PackingBuffer(loop, self.packing, self.streaming, self.staleness_cap(loop), self.stale_mode())

    @abstractmethod
    def decide(self, view: View) -> Decision:
        """What should change now. Must be cheap: the simulator calls it after every instant with events."""


def dispatchable(view: View) -> tuple[DispatchRequest, ...]:
    """Batches the staleness bound lets start now: step ``s``'s once step ``s - 1 - max_lag`` is trained."""
    st, loop = view.state, view.loop
    nxt = st.dispatched_step + 1
    if nxt > loop.steps or nxt - 1 - st.trained_step > loop.max_lag:
        return ()  # most instants: nothing to start (no list built)
    out: list[DispatchRequest] = []
    while nxt <= loop.steps and nxt - 1 - st.trained_step <= loop.max_lag:
        out.append(DispatchRequest(nxt, loop.groups_per_step))
        nxt += 1
    return tuple(out)


def heading_to_training(c: CellState) -> bool:
    return c.role == "draining" or (c.role == "switching" and c.switch_from not in TRAINING_ROLES)


def heading_to_rollout(c: CellState) -> bool:
    return c.role == "switching" and c.switch_from in TRAINING_ROLES


def ready_microsteps(view: View) -> int:
    """Micro-steps the packing buffer could hand out from complete groups not yet trained on (a step's last
    micro-step may hold fewer than ``micro_groups`` groups, so a partial one counts)."""
    return -(-view.state.ready_group_count // view.loop.micro_groups) * view.loop.micro_splits
