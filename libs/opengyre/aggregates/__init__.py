"""The shared domain's aggregates as pure folds: ``evolve_cell(cell, event, seq)`` is the one rule for a cell's
role and engine that every projection (the scheduler's state and SQL, the trainer's engines, the proxy's pool,
the report) folds through, and ``evolve_execution`` the one rule for an execution's dispatch and finish (the
scheduler's state and SQL, the trainer, the report), and ``evolve_task`` the one rule for a task's versions (synth's
task catalogue, the report), so none of them can judge an event differently."""

from ._cell import (
    CELL_EVENTS,
    ROLLOUT_ROLES,
    TRAINING_ROLES,
    TRANSITIONS,
    Cell,
    CellEvent,
    cell_key,
    check_transition,
    evolve_cell,
)
from ._execution import EXECUTION_EVENTS, Execution, ExecutionEvent, evolve_execution
from ._task import TASK_EVENTS, Task, TaskEvent, evolve_task

__all__ = [
    "CELL_EVENTS",
    "EXECUTION_EVENTS",
    "ROLLOUT_ROLES",
    "TASK_EVENTS",
    "TRAINING_ROLES",
    "TRANSITIONS",
    "Cell",
    "CellEvent",
    "Execution",
    "ExecutionEvent",
    "Task",
    "TaskEvent",
    "cell_key",
    "check_transition",
    "evolve_cell",
    "evolve_execution",
    "evolve_task",
]
