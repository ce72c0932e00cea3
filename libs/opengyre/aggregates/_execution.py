"""The execution aggregate: ``execution-dispatched`` and ``execution-finished`` folded into an
:class:`Execution` by one rule, the catalogue's, which every reader applies unchanged:

- an execution is dispatched once: a second ``execution-dispatched`` is refused (``duplicate-execution``);
- it finishes once (``already-finished``), and only after its dispatch (``unknown-execution``);
- a finish's score is finite (``invalid-score``) and absent exactly where no valid score exists: an evaluator or
  infrastructure failure with a score is refused (``score-on-failure``); a recorded-call count is never negative
  (``invalid-call-count``).

A refused event raises :class:`~opengyre.projection.Rejected` with that reason and leaves the execution as it was.
What a training step consumed is the step's, not the execution's (``training-step-completed`` names many).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opengyre.events import Event, ExecutionDispatched, ExecutionFinished
from opengyre.projection import Rejected

__all__ = ["EXECUTION_EVENTS", "Execution", "ExecutionEvent", "evolve_execution"]

ExecutionEvent = ExecutionDispatched | ExecutionFinished
EXECUTION_EVENTS: tuple[type[ExecutionEvent], ...] = (ExecutionDispatched, ExecutionFinished)
_UNSCORED = frozenset({"evaluator-failed", "infra-failed"})


@dataclass(frozen=True, slots=True)
class Execution:
    """One execution as its events made it; a reader that stores only some fields rebuilds the view from those
    (the fold reads only whether it finished)."""

    execution_id: str
    finished: bool = False
    status: str = "running"  # the finish's status once finished
    score: float | None = None
    seq: int = 0  # its last event


def evolve_execution(x: Execution | None, event: ExecutionEvent, seq: int = 0) -> Execution:
    """The execution after ``event`` (``x``: before it, None if never dispatched); raises Rejected by the rule
    above. Pure: the result depends on the arguments only."""
    return _FOLDS[type(event)](x, event, seq)


def _dispatched(x: Execution | None, e: ExecutionDispatched, seq: int) -> Execution:
    if x is not None:
        raise Rejected(f"execution {e.execution_id} was already dispatched", reason="duplicate-execution")
    return Execution(e.execution_id, seq=seq)


def _finished(x: Execution | None, e: ExecutionFinished, seq: int) -> Execution:
    if x is None:
        raise Rejected(f"execution {e.execution_id} finished but was never dispatched", reason="unknown-execution")
    if x.finished:
        raise Rejected(f"execution {e.execution_id} already finished", reason="already-finished")
    if e.score is not None and not math.isfinite(e.score):
        raise Rejected(f"{e.execution_id}: score {e.score}", reason="invalid-score")
    if e.recorded_calls is not None and e.recorded_calls < 0:
        raise Rejected(f"{e.execution_id}: {e.recorded_calls} recorded calls", reason="invalid-call-count")
    if e.score is not None and e.status in _UNSCORED:
        raise Rejected(f"{e.execution_id}: {e.status} with score {e.score}", reason="score-on-failure")
    return replace(x, finished=True, status=e.status, score=e.score, seq=seq)


_FOLDS: dict[type[Event], Callable[[Execution | None, Any, int], Execution]] = {
    ExecutionDispatched: _dispatched,
    ExecutionFinished: _finished,
}
