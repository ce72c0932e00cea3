"""QwenGyre elastic scheduler: cells move between rollout and training under the watermark rule."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
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

_WHERE: dict[str, str] = {
    "CommandRefused": "_commands",
    "arrival_role": "_commands",
    "check_drain": "_commands",
    "check_registration": "_commands",
    "check_role_request": "_commands",
    "protocol": "_commands",
    "SchedulerController": "_controller",
    "MicroStep": "_packing",
    "PackingBuffer": "_packing",
    "Decision": "_policy",
    "DispatchRequest": "_policy",
    "LoopConfig": "_policy",
    "Packing": "_policy",
    "Policy": "_policy",
    "RoleRequest": "_policy",
    "Target": "_policy",
    "View": "_policy",
    "dispatchable": "_policy",
    "SchedulerProjection": "_projection",
    "load_state": "_projection",
    "TRAINING_ROLES": "_rules",
    "TRANSITIONS": "_rules",
    "check_transition": "_rules",
    "sample_staleness": "_rules",
    "watermark_allows": "_rules",
    "CellState": "_state",
    "GroupState": "_state",
    "RunningExecution": "_state",
    "SchedulerState": "_state",
}

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


# Names load on first use (PEP 562): `python -m opengyre.scheduler.worker` (one per training cell) and the CLI
# import this package; eager, it cost the worker 1.0 CPU-s instead of 0.15 (bench/import_cost.py).
__getattr__ = lazy_exports(__name__, _WHERE)
