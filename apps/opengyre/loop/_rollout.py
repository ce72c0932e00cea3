"""One execution, from its dispatch to its ``execution-finished``: a fresh copy of the task's workspace, a key
from the proxy, the harness run in the sandbox against it, then the preserved workspace scored by the trainer.

The driver never writes an event itself: the scheduler appended the dispatch, the proxy records the calls, the
trainer's ScoreExecution grades the workspace and appends the outcome. ``end_execution`` is the one place an
execution ends, so what must happen at its end (the proxy sealing it) is added there once.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import grpc

from opengyre.harness import HarnessOutcome, HarnessSpec, HarnessTarget, run_harness
from opengyre.retry import backoff
from opengyre.sandbox import SandboxLimits
from opengyre.v1 import proxy_pb2, proxy_pb2_grpc, trainer_pb2, trainer_pb2_grpc

__all__ = ["ABANDONED", "Assignment", "Finished", "end_abandoned", "end_execution", "harness_failure", "roll_out"]

# How the harness ended -> the failure the runtime observed itself (ScoreExecution's ``failure_class``). A harness
# that could not reach the model (the endpoint unreachable or failing after its retries) is an infrastructure
# failure, masked downstream, when that is shown by more than its word (``harness_failure``); every other ending is
# graded on the workspace it left.
_MODEL_FAILED = "model-error"
log = logging.getLogger(__name__)
ABANDONED = "sandbox"  # the failure class of an execution whose harness was lost with the driver (``end_abandoned``)


@dataclass(frozen=True)
class Assignment:
    execution_id: str
    group_id: str
    task_id: str
    task_version: int
    cell_id: str
    step: int
    task_dir: Path
    instruction: str


@dataclass(frozen=True)
class Finished:
    assignment: Assignment
    status: str
    score: float | None
    failure_class: str
    finish_reason: str
    duration_s: float


def _seal_retryable(exc: BaseException) -> bool:
    # The seal waits for the log to hold the execution's calls: past its deadline (the log away) it is asked again.
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )


def harness_failure(outcome: HarnessOutcome, recorded_calls: int | None = None, failed_calls: int = 0) -> str:
    """The failure class the runtime observed in how the harness ended ("" for none: graded as it stands).

    The harness is the runtime's program, not the policy's output; but once the policy made a model call its
    commands run as the harness's user in the harness's sandbox, and may signal the harness themselves (a
    ``kill -9 $PPID``, a SIGABRT): an ending the policy could have caused must not turn a failing attempt into a
    masked one. So:

    - a SIGKILL while the kernel counted an OOM kill (or cannot say) is the OOM killer's: ``oom``, masked;
    - a harness that ended by any other signal, or exited non-zero without a summary, having made no model call
      at all ran nothing of the policy's: the sandbox's failure (infrastructure, masked);
    - after a model call, every ending (a signal included) is graded on the workspace it left.

    The built-in harness's summary saying the model failed (``model-error``) is written where the policy's commands
    can write too: it masks the execution (``engine``) only when nothing of the policy's ran (no recorded call), or
    the proxy answered some of its calls with a failure (``failed_calls``, from the seal); otherwise the claim is
    not believed and the workspace is graded — a forged summary must not hide a failing attempt from training."""
    if outcome.finish_reason == _MODEL_FAILED and (recorded_calls == 0 or failed_calls > 0):
        return "engine"
    if outcome.signal == signal.SIGKILL and outcome.oom_kills != 0:
        return "oom"
    if outcome.timed_out or recorded_calls != 0:  # None: not known, so not masked
        return ""
    if outcome.signal is not None or (outcome.summary is None and outcome.exit_code != 0):
        return "sandbox"
    return ""


def _retryable(exc: BaseException) -> bool:
    # NOT_FOUND: the trainer's projection has not folded the dispatch yet; UNAVAILABLE: the service restarts.
    return isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.UNAVAILABLE,
    )


async def end_execution(
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub,
    trainer: trainer_pb2_grpc.TrainerServiceAsyncStub,
    a: Assignment,
    workspace: Path,
    outcome: HarnessOutcome,
) -> trainer_pb2.ScoreExecutionReply:
    """The execution is over: the proxy seals it (no further calls; every recorded call flushed to the log) and
    the trainer grades the preserved workspace and records ``execution-finished`` with the proxy's call count,
    so no step samples the execution before all its calls are in (docs/proxy.md, "Ending an execution")."""
    calls, failed = await _seal(proxy, a.execution_id)
    req = trainer_pb2.ScoreExecutionRequest(
        execution_id=a.execution_id, task_dir=str(a.task_dir), workspace=str(workspace), timed_out=outcome.timed_out,
        has_exit_code=True, exit_code=outcome.exit_code, output=(outcome.stdout + outcome.stderr)[-2000:],
        failure_class=harness_failure(outcome, calls, failed), has_recorded_calls=True, recorded_calls=calls,
        sandbox=outcome.isolation,
    )  # fmt: skip
    return await _score(trainer, req)


async def end_abandoned(
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub,
    trainer: trainer_pb2_grpc.TrainerServiceAsyncStub,
    a: Assignment,
    workspace: Path,
    why: str,
) -> trainer_pb2.ScoreExecutionReply:
    """An execution whose harness was lost with the runtime that ran it (a driver killed mid-run) ends here, once:
    sealed like any other (a harness left running can record nothing more), then recorded as an infrastructure
    failure (``sandbox``: the sandbox's runtime went away), which training masks rather than scores: its
    trajectory is cut off by the crash, not by the policy."""
    req = trainer_pb2.ScoreExecutionRequest(
        execution_id=a.execution_id, task_dir=str(a.task_dir), workspace=str(workspace), output=why,
        failure_class=ABANDONED, has_recorded_calls=True, recorded_calls=(await _seal(proxy, a.execution_id))[0],
    )  # fmt: skip
    return await _score(trainer, req)


async def _seal(proxy: proxy_pb2_grpc.ProxyServiceAsyncStub, eid: str) -> tuple[int, int]:
    """The proxy seals the execution: no further calls; the count of those it recorded, all flushed to the log,
    and of those it answered with a failure."""
    sealed = proxy_pb2.SealExecutionRequest(execution_id=eid)
    async for attempt in backoff(f"sealing {eid}", first_s=0.1, max_s=2.0, retry_if=_seal_retryable, attempts=60):
        with attempt:
            seal = await proxy.SealExecution(sealed, timeout=60)
    return int(seal.recorded_calls), int(seal.failed_calls)


async def _score(
    trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, req: trainer_pb2.ScoreExecutionRequest
) -> trainer_pb2.ScoreExecutionReply:
    eid = req.execution_id
    try:
        async for attempt in backoff(f"scoring {eid}", first_s=0.1, max_s=2.0, retry_if=_retryable, attempts=60):
            with attempt:
                return await trainer.ScoreExecution(req, timeout=300)
    except grpc.aio.AioRpcError as exc:
        if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
            raise
        # Scored already (a reply lost before a retry): the recorded outcome stands; read it back.
        row = await trainer.GetExecution(trainer_pb2.GetExecutionRequest(execution_id=eid), timeout=30)
        return trainer_pb2.ScoreExecutionReply(
            status=row.status, has_score=row.has_score, score=row.score, failure_class=row.failure_class
        )
    raise AssertionError("unreachable: backoff re-raises its last error")


def task_skills(task_dir: Path) -> Path | None:
    """The task's skills folder (``environment/skills``, Harbor's ``skills_dir``), shown read-only to its harness;
    None where it has none, or where it or ``environment`` is a link (it could point at the task's tests/ or
    solution/: not shown, and said)."""
    env = task_dir / "environment"
    skills = env / "skills"
    if env.is_symlink() or skills.is_symlink():
        log.warning("task %s: its environment/skills is a link; not shown to the harness", task_dir)
        return None
    return skills if skills.is_dir() else None


def _fresh_workspace(task_dir: Path, root: Path) -> Path:
    ws = root / "app"
    if root.exists():
        shutil.rmtree(root)  # a retried execution starts from the task's initial state, never from a wreck
    src = task_dir / "environment" / "workspace"
    if src.is_dir():
        shutil.copytree(src, ws, symlinks=True)
    else:
        ws.mkdir(parents=True)
    return ws


async def roll_out(
    a: Assignment,
    *,
    proxy: proxy_pb2_grpc.ProxyServiceAsyncStub,
    trainer: trainer_pb2_grpc.TrainerServiceAsyncStub,
    spec: HarnessSpec,
    model: str,
    workdir: Path,
    timeout_s: float,
    sandbox: str | None = None,
    group_memory_mb: int = 0,
) -> Finished:
    """``group_memory_mb``: the memory the rollouts of ``a``'s group share (a cgroup limit; 0: none)."""
    ws = await asyncio.to_thread(_fresh_workspace, a.task_dir, workdir / a.execution_id)
    req = proxy_pb2.OpenExecutionRequest(execution_id=a.execution_id)
    async for attempt in backoff(f"opening {a.execution_id}", first_s=0.1, max_s=2.0, retry_if=_retryable, attempts=60):
        with attempt:
            access = await proxy.OpenExecution(req, timeout=30)
    target = HarnessTarget(
        access.base_url, access.api_key, model, ws, a.instruction, access.context_length or None,
        task_skills(a.task_dir),
    )  # fmt: skip
    # The proxy is its way out: the sandbox's egress. Its group's rollouts share one memory budget.
    limits = SandboxLimits(
        timeout_s=timeout_s,
        memory_mb=8192,
        group_memory_mb=group_memory_mb or None,
        memory_group=a.group_id if group_memory_mb else None,
        memory_poll_s=1.0,  # the kernel holds the budget; the poller only backs it (a command over it alone)
    )
    outcome = await asyncio.to_thread(run_harness, spec, target, limits, backend=sandbox)
    if outcome.isolation == "none":  # chosen explicitly, and said of each execution (its event says so too)
        log.warning("execution %s: its harness ran without isolation (sandbox 'none')", a.execution_id)
    reply = await end_execution(proxy, trainer, a, ws, outcome)
    return Finished(
        a, reply.status, reply.score if reply.has_score else None, reply.failure_class, outcome.finish_reason,
        outcome.duration_s,
    )  # fmt: skip
