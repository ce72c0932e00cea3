"""The shared domain's aggregates as pure folds: ``evolve_cell(cell, event, seq)`` is the one rule for a cell's
role and engine that every projection (the scheduler's state and SQL, the trainer's engines, the proxy's pool,
the report) folds through, so none of them can judge a cell event differently from the others."""

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

__all__ = [
    "CELL_EVENTS",
    "ROLLOUT_ROLES",
    "TRAINING_ROLES",
    "TRANSITIONS",
    "Cell",
    "CellEvent",
    "cell_key",
    "check_transition",
    "evolve_cell",
]
