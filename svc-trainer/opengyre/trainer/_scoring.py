"""From the end of an execution to its ``ExecutionFinished`` event.

Reward never comes from duration, trajectory length or termination status: a timed-out execution is graded
like a completed one (partial work gets its real score). An execution that died of infrastructure (OOM, a
sandbox or network failure) is not graded at all: it is recorded as such and masked downstream.
"""

from __future__ import annotations

from pathlib import Path

from opengyre.events import ExecutionFinished

from ._evaluator import Evaluator
from ._failures import INFRA_CLASSES, TRANSIENT_CLASSES, classify_failure

__all__ = ["score_execution"]


def score_execution(
    execution_id: str,
    evaluator: Evaluator,
    task_dir: Path,
    workspace: Path,
    *,
    timed_out: bool = False,
    exit_code: int | None = None,
    output: str = "",
) -> ExecutionFinished:
    """Grade one finished execution. ``exit_code``/``output`` describe how the agent process ended."""
    cls = None if timed_out else classify_failure(exit_code, output)
    if cls in INFRA_CLASSES:
        return ExecutionFinished(
            execution_id=execution_id,
            status="infra-failed",
            failure_class=cls,
            exit_code=exit_code,
            detail=output[-2000:],
        )
    ev = evaluator.evaluate(task_dir, workspace)
    if not ev.valid:
        return ExecutionFinished(
            execution_id=execution_id,
            status="evaluator-failed",
            failure_class=ev.failure_class or "evaluator",
            exit_code=ev.exit_code,
            detail=ev.detail[-2000:],
        )
    return ExecutionFinished(
        execution_id=execution_id,
        status="timed-out" if timed_out else "completed",
        score=ev.score,
        # A transient hiccup (a tool timeout, a network stall) travels along: admission may filter it.
        failure_class=cls if cls in TRANSIENT_CLASSES else None,
        exit_code=exit_code,
        detail=ev.detail,
    )
