"""From the end of an execution to its ``ExecutionFinished`` event.

Reward never comes from duration, trajectory length or termination status: a timed-out execution is graded
like a completed one (partial work gets its real score). An execution that died of infrastructure (its process
SIGKILLed from outside, or a failure the runtime reports: the sandbox, the engine) is not graded at all: it is
recorded as such and masked downstream. What the agent printed never decides a class (see ``_failures``).
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec

from opengyre.events import ExecutionFinished, FailureClass
from opengyre.grading import Evaluator

from ._failures import AGENT_CLASSES, INFRA_CLASSES, REPORTABLE_CLASSES, TRANSIENT_CLASSES, classify_failure

__all__ = ["SANDBOX_NAME", "score_execution"]

# A backend's name (registerable, so not a closed set): short, lower-case, printable as it is.
SANDBOX_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")


def score_execution(
    execution_id: str,
    evaluator: Evaluator,
    task_dir: Path,
    workspace: Path,
    *,
    timed_out: bool = False,
    exit_code: int | None = None,
    output: str = "",
    failure: FailureClass | None = None,
    recorded_calls: int | None = None,
    sandbox: str = "",
) -> ExecutionFinished:
    """Grade one finished execution. ``exit_code`` is how the agent process ended (124, ``timeout(1)``'s code, is
    the execution's time limit); ``failure`` a failure the runtime that ran it observed itself (network, sandbox,
    engine, an infrastructure-side timeout); ``output`` its output tail, kept as detail only; ``recorded_calls``
    the proxy's count from sealing the execution and ``sandbox`` the isolation the harness ran under (both
    carried by the event, see ``ExecutionFinished``)."""
    if recorded_calls is not None and recorded_calls < 0:
        raise ValueError(f"recorded_calls must be >= 0, got {recorded_calls}")
    if sandbox and not SANDBOX_NAME.fullmatch(sandbox):
        raise ValueError(f"sandbox must name an isolation (namespace, none, nested, docker, ...), got {sandbox!r}")
    # A runtime that names its sandbox observed how the harness ended and reports an OOM kill itself (``oom``):
    # an exit code 137 is then not guessed to be one (the policy's commands can SIGKILL their own harness).
    guess = None if sandbox else exit_code
    fin = _grade(execution_id, evaluator, task_dir, workspace, timed_out, exit_code, guess, output, failure)
    return msgspec.structs.replace(fin, recorded_calls=recorded_calls, sandbox=sandbox)


def _grade(
    execution_id: str,
    evaluator: Evaluator,
    task_dir: Path,
    workspace: Path,
    timed_out: bool,
    exit_code: int | None,
    classified_exit: int | None,
    output: str,
    failure: FailureClass | None,
) -> ExecutionFinished:
    if failure is not None and failure not in REPORTABLE_CLASSES:
        raise ValueError(f"a runtime reports one of {sorted(REPORTABLE_CLASSES)}, not {failure!r}")
    # The agent's output is bytes it chose (/dev/urandom): a NUL would make the event one no store keeps.
    output = output.replace("\x00", "\ufffd")
    timed_out = timed_out or exit_code == 124
    cls = failure or (None if timed_out else classify_failure(classified_exit))
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
            # The grader's own failure: infrastructure (masked) or the evaluator (excluded), never the agent's.
            status="infra-failed" if ev.failure_class in INFRA_CLASSES else "evaluator-failed",
            failure_class=ev.failure_class or "evaluator",
            exit_code=ev.exit_code,
            detail=ev.detail[-2000:],
        )
    # The agent's code hung or ran out of memory while graded (scored 0), or a transient hiccup of the run
    # that admission may filter; otherwise no class.
    agent = ev.failure_class if ev.failure_class in AGENT_CLASSES else None
    return ExecutionFinished(
        execution_id=execution_id,
        status="timed-out" if timed_out else "completed",
        score=ev.score,
        failure_class=agent or (cls if cls in TRANSIENT_CLASSES else None),
        exit_code=exit_code,
        detail=ev.detail[-2000:],
    )
