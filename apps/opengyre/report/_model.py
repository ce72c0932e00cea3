"""What a run's report holds: plain, frozen records, every figure derived from events in the log (never invented).

Times are seconds since the first folded event (its ``occurred_at``: the producer's clock), so a report of a
finished run and one of a live run read the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import CellRole

__all__ = [
    "CellSpan",
    "CellUse",
    "CellView",
    "ExecutionTally",
    "HardeningView",
    "RoundDifficulty",
    "RunSummary",
    "StepRewards",
    "TimeSplit",
    "VersionCalls",
    "WatermarkPoint",
]


@dataclass(frozen=True, slots=True)
class StepRewards:
    """Rewards of the executions one training step consumed (``execution_ids`` and ``dropped``) that have a
    score; executions the log never saw finish are counted in ``unfinished``, those with no score in ``unscored``.
    """

    step: int
    weight_version: str
    at_s: float
    count: int
    mean: float | None
    min: float | None
    max: float | None
    trained: int
    dropped: int
    unscored: int
    unfinished: int
    loss: float


@dataclass(frozen=True, slots=True)
class CellSpan:
    """A cell held ``role`` from ``start_s`` to ``end_s`` (None: it still holds it at the last folded event)."""

    cell_id: str
    role: CellRole
    start_s: float
    end_s: float | None
    reason: str


@dataclass(frozen=True, slots=True)
class CellView:
    cell_id: str
    node: str
    capacity: int
    resident: bool
    role: CellRole
    since_s: float
    changes: int


@dataclass(frozen=True, slots=True)
class WatermarkPoint:
    """After the event at ``seq``: w(t) = executions dispatched - finished, and CR(t) = capacity of the cells in
    rollout (the scheduler's own definitions)."""

    at_s: float
    seq: int
    watermark: int
    rollout_capacity: int


@dataclass(frozen=True, slots=True)
class RoundDifficulty:
    """Task versions at hardening round ``round`` (a task's version: 1 as synthesized, +1 per hardening)."""

    round: int
    tasks: int
    patterns_mean: float  # pattern instances per task version
    knobs: dict[str, float]  # "pattern.knob" -> mean over the task versions that set it
    executions: int  # finished executions dispatched on a task at this version, with a score
    reward_mean: float | None


@dataclass(frozen=True, slots=True)
class HardeningView:
    task_id: str
    from_version: int
    to_version: int
    at_s: float
    bypassed: str
    reason: str
    mean_reward: float | None  # of the too-easy verdict that preceded it, when there was one


@dataclass(frozen=True, slots=True)
class ExecutionTally:
    dispatched: int
    running: int
    finished: int
    by_status: dict[str, int]
    by_failure_class: dict[str, int]
    scored: int
    reward_mean: float | None


@dataclass(frozen=True, slots=True)
class VersionCalls:
    weight_version: str
    calls: int
    prompt_tokens: int  # prompt-delta tokens (what each call added to its parent's prefix)
    output_tokens: int


@dataclass(frozen=True, slots=True)
class TimeSplit:
    """Wall-clock seconds in which each kind of work was going on (the union of its intervals; the kinds overlap
    when the run streams), and cell-seconds per role. ``span_s``: first to last folded event.

    synthesis: a task version from what asked for it (its skill's ingestion; the too-easy verdict for a hardened
    version) to its validation. rollout: an execution from dispatch to finish. training / switching: a cell in a
    training role / draining or switching. Each is None when the log holds no event that could show it.
    """

    span_s: float
    synthesis_s: float | None
    rollout_s: float | None
    training_s: float | None
    switching_s: float | None
    cell_seconds: dict[str, float]


@dataclass(frozen=True, slots=True)
class CellUse:
    """How the cells' time was spent over the RL loop's window (first dispatch to last training step),
    as shares of cells x window; the shares sum to 1. What the log can say, per cell and instant:

    - cells in ``rollout``: their slots are filled by the executions in flight (dispatched, not finished); the
      share of slots held is busy, the rest idle (``rollout_idle``: slot-idle, the simulator's definition);
    - cells in a training role: while a training step runs, one of them is busy (the trainer is one process;
      the log has no micro-step events to show several at once), the others idle (``training_idle``); between
      steps all are idle. A step runs from the last finish of the
      executions it consumed to its ``training-step-completed`` (it trains as soon as its groups are complete;
      the log has no start event);
    - ``draining`` / ``switching``: ``switching``, neither busy nor idle;
    - ``idle`` (no role): ``unassigned``, counted as idle.
    """

    window_s: float
    cells: int
    rollout_busy: float
    rollout_idle: float
    training_busy: float
    training_idle: float
    switching: float
    unassigned: float

    @property
    def idle(self) -> float:
        """The cell-idle fraction: rollout slots idle, training cells idle, cells without a role."""
        return self.rollout_idle + self.training_idle + self.unassigned

    @property
    def busy(self) -> float:
        return self.rollout_busy + self.training_busy


@dataclass(frozen=True)
class RunSummary:
    """A run as its event log tells it. ``notes`` say what the log could not show (and so is absent here);
    ``anomalies`` count events that contradict the ones before them (folded no further), by reason."""

    first_seq: int
    last_seq: int
    events: int
    started_at: str  # ISO time of the first folded event ("" when none)
    by_type: dict[str, int]
    skills_accepted: int
    skills_rejected: int
    tasks: int
    tasks_validated: int
    tasks_rejected: int
    too_easy: int
    hardenings: list[HardeningView]
    executions: ExecutionTally
    steps: list[StepRewards]
    rewards_by_batch: dict[int, tuple[int, float]]  # dispatch step -> (scored executions, mean reward)
    cells: list[CellView]
    cell_spans: list[CellSpan]
    watermark: list[WatermarkPoint]
    difficulty: list[RoundDifficulty]
    time: TimeSplit
    weight_versions: list[VersionCalls]
    published: list[tuple[int, str, float]]  # (step, weight version, at_s)
    notes: list[str] = field(default_factory=list)
    anomalies: dict[str, int] = field(default_factory=dict)
    cell_use: CellUse | None = None  # None: no dispatch to a cell, or no training step, in the log

    @property
    def empty(self) -> bool:
        return self.events == 0
