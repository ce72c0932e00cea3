"""The domain events every OpenGyre service speaks.

Rules: a tag never changes; a new field gets a default; a breaking change bumps ``version`` and registers a
pure upcaster for the old shape (see ``_registry.register_upcaster``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import msgspec

from ._base import Event
from ._text import RawText

__all__ = [
    "UPCASTERS",
    "BenchRunCompleted",
    "CallTimings",
    "CellEngineChanged",
    "CellRegistered",
    "CellRole",
    "CellRoleChanged",
    "DriftReport",
    "ExecutionDispatched",
    "ExecutionFinished",
    "ExecutionStatus",
    "FailureClass",
    "ModelCallRecorded",
    "PatternUse",
    "PayloadRef",
    "PayloadsCompacted",
    "SkillIngested",
    "TaskHardened",
    "TaskSynthesized",
    "TaskTooEasy",
    "TaskValidated",
    "ToolCallPayload",
    "TrainingStepCompleted",
    "TrajectoryRole",
    "WeightSpan",
    "WeightsPublished",
]

# --- data layer (svc-synth, Skill2Env) -------------------------------------------------------------


class SkillIngested(Event, frozen=True, kw_only=True, tag="skill-ingested"):
    owner = "synth"
    aggregate = "skill"
    aggregate_key = "skill_id"

    skill_id: str
    name: str
    description: str
    source: str = ""
    digest: str = ""
    metadata: dict[str, str] = msgspec.field(default_factory=dict)
    # Skill2Env's filters: a rejected skill is recorded too, with the reason (accepted=False).
    accepted: bool = True
    reason: str = ""
    domain: str = ""
    capabilities: dict[str, float] = msgspec.field(default_factory=dict)  # the five dimensions, 0..1


class PatternUse(msgspec.Struct, frozen=True, kw_only=True):
    """One difficulty pattern instantiated in a task, with its control-knob settings."""

    pattern_id: str
    knobs: dict[str, float] = msgspec.field(default_factory=dict)


class TaskSynthesized(Event, frozen=True, kw_only=True, tag="task-synthesized"):
    owner = "synth"
    aggregate = "task"
    aggregate_key = "task_id"

    task_id: str
    skill_id: str
    task_version: int = 1
    patterns: list[PatternUse] = msgspec.field(default_factory=list)
    blueprint: dict[str, object] = msgspec.field(default_factory=dict)
    task_dir: str = ""
    capabilities: dict[str, float] = msgspec.field(default_factory=dict)


class TaskValidated(Event, frozen=True, kw_only=True, tag="task-validated"):
    owner = "synth"
    aggregate = "task"
    aggregate_key = "task_id"

    task_id: str
    task_version: int = 1
    ok: bool
    checks: dict[str, bool] = msgspec.field(default_factory=dict)
    reason: str = ""
    reasons: dict[str, str] = msgspec.field(default_factory=dict)  # each gate's verdict, explained


class TaskTooEasy(Event, frozen=True, kw_only=True, tag="task-too-easy"):
    owner = "synth"
    aggregate = "task"
    aggregate_key = "task_id"

    task_id: str
    task_version: int = 1
    mean_reward: float
    n_samples: int
    threshold: float = 0.7


class TaskHardened(Event, frozen=True, kw_only=True, tag="task-hardened"):
    owner = "synth"
    aggregate = "task"
    aggregate_key = "task_id"

    task_id: str
    from_version: int
    to_version: int
    patterns: list[PatternUse] = msgspec.field(default_factory=list)
    reason: str = ""
    # The diagnosis: the challenge (pattern instance) the solver bypassed, and the new version's contract.
    bypassed: str = ""
    blueprint: dict[str, object] = msgspec.field(default_factory=dict)
    task_dir: str = ""


# --- system layer (svc-scheduler, svc-proxy, svc-trainer, QwenGyre) ---------------------------------

ExecutionStatus = Literal["completed", "timed-out", "evaluator-failed", "infra-failed"]
# Infrastructure failures are masked, never trained as negatives; "evaluator" means no valid score.
# "agent-timeout" / "agent-oom" / "agent-disk": the agent's own code hung, exhausted the sandbox's memory or filled
# its disk quota while graded; "agent-killed": it killed its grader (a signal the sandbox did not send, and no OOM
# kill on the machine): the agent's failure, scored 0 and trained (not infrastructure, not a reward it wrote).
FailureClass = Literal[
    "oom", "timeout", "sandbox", "network", "engine", "evaluator", "other", "agent-timeout", "agent-oom",
    "agent-disk", "agent-killed",
]  # fmt: skip
TrajectoryRole = Literal["main", "main-summary", "sub-agent", "sub-agent-summary"]
CellRole = Literal["idle", "rollout", "draining", "switching", "training-core", "training-satellite"]


class ExecutionDispatched(Event, frozen=True, kw_only=True, tag="execution-dispatched"):
    owner = "scheduler"
    aggregate = "execution"
    aggregate_key = "execution_id"

    execution_id: str
    task_id: str
    group_id: str
    task_version: int = 1
    step: int = 0
    weight_version: str = "default"
    timeout_s: float = 0.0
    cell_id: str | None = None
    # Members the group will have (16 for GSPO); 0 = unknown. Lets a consumer tell a complete group from a
    # partially dispatched one, so training never packs a group before all its members finished.
    group_size: int = 0


class ExecutionFinished(Event, frozen=True, kw_only=True, tag="execution-finished"):
    """An execution ended. ``score`` is the evaluator's on the preserved workspace, also after a timeout;
    it is None exactly when no valid score exists (evaluator or infrastructure failure).

    ``recorded_calls``: the proxy's count of the execution's model calls once it sealed the execution
    (``ProxyService.SealExecution``; every one of them is in the log before this event); the trainer samples the
    execution only once it has applied that many. None (events written before the field existed, or a runtime
    that does not seal): calls may still follow the finish. Added with a default, so v1 bodies decode as they
    are: no version bump, no upcaster.

    ``sandbox``: the isolation the harness ran under (``namespace``, ``none``, ``nested``, ``docker``, ...), so a
    run without isolation says so on each of its executions; "" where not known (events written before the field
    existed, an execution abandoned with its runtime). Added with a default, likewise."""

    owner = "trainer"
    aggregate = "execution"
    aggregate_key = "execution_id"

    execution_id: str
    status: ExecutionStatus
    score: float | None = None
    failure_class: FailureClass | None = None
    exit_code: int | None = None
    detail: str = ""
    recorded_calls: int | None = None
    sandbox: str = ""


class ToolCallPayload(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call exactly as the engine emitted it (arguments unparsed), so harness re-formatting cannot drift."""

    id: str
    name: str
    arguments: RawText  # the model's bytes, NUL included: stored serialized only (see ``_text``)


class CallTimings(msgspec.Struct, frozen=True, kw_only=True):
    queued_ms: float = 0.0
    ttft_ms: float = 0.0
    total_ms: float = 0.0


class DriftReport(msgspec.Struct, frozen=True, kw_only=True):
    """Where re-rendering the harness's messages disagreed with the recorded token prefix."""

    kind: str
    position: int
    detail: str = ""


class WeightSpan(msgspec.Struct, frozen=True, kw_only=True):
    """Output tokens ``[start, end)`` of a call were generated under ``version`` (weights can change mid-call)."""

    version: str
    start: int
    end: int


class PayloadRef(msgspec.Struct, frozen=True, kw_only=True):
    """Where a call's token payload is stored: in the payload stream, under its execution, by content digest.

    The payload (``opengyre.trajectory.encode_payload``) holds the prompt delta ids, output ids, behaviour
    logprobs and the conditioning context; the event keeps the lengths so projections fold without it.
    """

    digest: str  # SHA-256 (hex) of the encoded payload
    size: int  # encoded bytes
    prompt_delta: int  # len(prompt_delta_ids)
    output: int  # len(output_ids) == len(output_logprobs)


class ModelCallRecorded(Event, frozen=True, kw_only=True, tag="model-call-recorded", omit_defaults=True):
    """One model call, token-in/token-out, as a node of the execution's trajectory tree.

    Its body leaves out every field that has its default (the empty token lists of a call by reference, a root's
    parent and prefix, ``drift``, ``context``, ``attempts`` of 1, ...): the decoder fills them back in, so a body
    written with every field (every log before) and one without them decode to the same event, in either build.
    It is the one event written per model call, so what it costs per call is what short calls pay per token.

    The call's prompt is ``tokens(parent)[:prefix_len] + prompt_delta_ids`` where ``tokens(parent)`` is the
    parent node's prompt followed by its output. Events carry only this delta, never the whole prefix again.

    v2: the tokens, logprobs and context are either inline (v1's only form; tests and tools write it) or, as the
    proxy records them, stored once out of the event under ``payload`` with the three lists empty and no
    ``context`` (``opengyre.trajectory.resolve_calls`` fills them back in). A v1 body is a valid v2 body.
    """

    version = 2
    owner = "proxy"
    aggregate = "execution"
    aggregate_key = "execution_id"

    execution_id: str
    call_id: str
    parent_call_id: str | None = None
    prefix_len: int = 0
    prompt_delta_ids: list[int] = msgspec.field(default_factory=list)
    output_ids: list[int] = msgspec.field(default_factory=list)
    output_logprobs: list[float] = msgspec.field(default_factory=list)
    role: TrajectoryRole = "main"
    model: str = ""
    engine_id: str = ""
    weight_version: str = "default"
    finish_reason: str = ""
    dialect: str = ""
    tool_calls: list[ToolCallPayload] = msgspec.field(default_factory=list)
    timings: CallTimings = msgspec.field(default_factory=CallTimings)
    drift: DriftReport | None = None
    context_ref: str | None = None
    attempts: int = 1
    # The conditioning context as a delta against the parent's conversation ({"base": n, "messages": [...],
    # "tools"?, "response"}), inline when small; larger ones go out of band under ``context_ref``.
    context: dict[str, Any] | None = None
    # How the prompt was built: "root", "extension" (token-level, of the parent), "retry", "rewrite".
    branch: str = ""
    # Per-token weight versions when they changed during the call (empty: every token is ``weight_version``).
    weight_versions: list[WeightSpan] = msgspec.field(default_factory=list)
    # The temperature the engine divided the logits by before computing ``output_logprobs`` (1.0 for a greedy
    # call: SGLang computes its logprobs from the raw logits). None: unknown (an older recorder, an engine whose
    # logprobs are not at the sampling temperature); a trainer must not assume one.
    temperature: float | None = None
    # The tokens, logprobs and context stored out of the event (None: inline, as in v1).
    payload: PayloadRef | None = None

    @property
    def n_prompt_delta(self) -> int:
        return self.payload.prompt_delta if self.payload is not None else len(self.prompt_delta_ids)

    @property
    def n_output(self) -> int:
        return self.payload.output if self.payload is not None else len(self.output_ids)


class PayloadsCompacted(Event, frozen=True, kw_only=True, tag="payloads-compacted"):
    """The token payloads of an execution's calls recorded before this event were deleted (retention).

    Appended by the trainer's retention once a training step consumed the execution and the run moved past the
    replay horizon. Projections keep every count and length and mark those calls compacted; nothing is invented.
    """

    owner = "trainer"
    aggregate = "execution"
    aggregate_key = "execution_id"

    execution_id: str
    run_id: str = "default"
    step: int  # the step that consumed the execution
    calls: int = 0  # payloads deleted
    bytes: int = 0  # their encoded size
    reason: str = ""


class CellRegistered(Event, frozen=True, kw_only=True, tag="cell-registered"):
    owner = "scheduler"
    aggregate = "cell"
    aggregate_key = "cell_id"

    cell_id: str
    node: str = "local"
    gpus: int = 1
    capacity: int = 1
    role: CellRole = "rollout"
    engine_url: str | None = None
    # A cell of the resident rollout pool never turns to training (QwenGyre's optional resident pool).
    resident: bool = False


class CellRoleChanged(Event, frozen=True, kw_only=True, tag="cell-role-changed"):
    owner = "scheduler"
    aggregate = "cell"
    aggregate_key = "cell_id"

    cell_id: str
    from_role: CellRole
    to_role: CellRole
    reason: str = ""
    engine_url: str | None = None


class CellEngineChanged(Event, frozen=True, kw_only=True, tag="cell-engine-changed"):
    """A registered cell is served by another engine from now on (its engine restarted at a new address, e.g. a
    rollout driver started again after a crash). The cell keeps its role and its place; routing follows the URL."""

    owner = "scheduler"
    aggregate = "cell"
    aggregate_key = "cell_id"

    cell_id: str
    engine_url: str
    reason: str = ""


class TrainingStepCompleted(Event, frozen=True, kw_only=True, tag="training-step-completed"):
    owner = "trainer"
    aggregate = "training"
    aggregate_key = "run_id"

    run_id: str = "default"
    step: int
    weight_version: str
    loss: float
    n_samples: int
    n_tokens: int
    execution_ids: list[str] = msgspec.field(default_factory=list)
    staleness_mean: float = 0.0
    staleness_max: int = 0
    metrics: dict[str, float] = msgspec.field(default_factory=dict)
    # Executions the step consumed without training on them, with why ("masked:infra:oom", "filtered:...",
    # "excluded:evaluator-failure", "no-signal:lone-survivor"); ``execution_ids`` are the ones trained.
    dropped: dict[str, str] = msgspec.field(default_factory=dict)


class WeightsPublished(Event, frozen=True, kw_only=True, tag="weights-published"):
    owner = "trainer"
    aggregate = "weights"
    aggregate_key = "run_id"

    run_id: str = "default"
    weight_version: str
    step: int
    uri: str
    digest: str = ""
    format: str = "safetensors"


# --- inference layer (svc-bench, AgentPerfBench) ----------------------------------------------------


class BenchRunCompleted(Event, frozen=True, kw_only=True, tag="bench-run-completed"):
    owner = "bench"
    aggregate = "bench"
    aggregate_key = "run_id"

    run_id: str
    profile: str
    concurrency: int
    engine: str = ""
    metrics: dict[str, float] = msgspec.field(default_factory=dict)


# --- upcasters (type, from_version, pure function of the old body) --------------------------------------


def _inline_tokens_v1(body: dict[str, Any]) -> dict[str, Any]:
    return body  # v2 only added ``payload`` (absent: the tokens are inline, as every v1 event has them)


UPCASTERS: list[tuple[str, int, Callable[[dict[str, Any]], dict[str, Any]]]] = [
    ("model-call-recorded", 1, _inline_tokens_v1)
]
