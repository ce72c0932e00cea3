"""QwenGyre elastic scheduler: cells move between rollout and training under the watermark rule."""

from ._commands import (
    CommandRefused,
    arrival_role,
    check_drain,
    check_registration,
    check_role_request,
    protocol,
)
from ._controller import SchedulerController
from ._packing import MicroStep, PackingBuffer
from ._policy import Decision, DispatchRequest, LoopConfig, Packing, Policy, RoleRequest, Target, View, dispatchable
from ._projection import SchedulerProjection, load_state
from ._rules import TRAINING_ROLES, TRANSITIONS, check_transition, sample_staleness, watermark_allows
from ._state import CellState, GroupState, RunningExecution, SchedulerState

__all__ = [
    "TRAINING_ROLES",
    "TRANSITIONS",
    "CellState",
    "CommandRefused",
    "Decision",
    "DispatchRequest",
    "GroupState",
    "LoopConfig",
    "MicroStep",
    "Packing",
    "PackingBuffer",
    "Policy",
    "RoleRequest",
    "RunningExecution",
    "SchedulerController",
    "SchedulerProjection",
    "SchedulerState",
    "Target",
    "View",
    "arrival_role",
    "check_drain",
    "check_registration",
    "check_role_request",
    "check_transition",
    "dispatchable",
    "load_state",
    "protocol",
    "sample_staleness",
    "watermark_allows",
]
