"""The fold of a run's events into a :class:`RunSummary`: one handler per event type, dispatched by type.

A pure fold: every value comes from the events (their fields and ``occurred_at``), never the clock, so folding
the same log twice gives equal summaries, and a live fold equals the fold of the finished log up to its position.
An event that contradicts what came before (a finish without a dispatch, a role change from the wrong role) is
counted under ``anomalies`` with why, and folded no further: a report never papers over a broken log.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from opengyre.aggregates import (
    ROLLOUT_ROLES,
    TRAINING_ROLES,
    Cell,
    CellEvent,
    Execution,
    ExecutionEvent,
    Task,
    TaskEvent,
    evolve_cell,
    evolve_execution,
    evolve_task,
)
from opengyre.projection import Rejected

from ..events import (
    CellRegistered,
    CellRole,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    PatternUse,
    SkillIngested,
    TaskHardened,
    TaskSynthesized,
    TaskTooEasy,
    TaskValidated,
    TrainingStepCompleted,
    WeightsPublished,
)
from ._model import (
    CellSpan,
    CellUse,
    CellView,
    ExecutionTally,
    HardeningView,
    RoundDifficulty,
    RunSummary,
    StepRewards,
    TimeSplit,
    VersionCalls,
    WatermarkPoint,
)

__all__ = ["FOLDED_TYPES", "RunFold", "fold_events"]

# The cell aggregate's roles: only a cell in "rollout" serves executions.
_SERVING: frozenset[CellRole] = ROLLOUT_ROLES
_TRAINING: frozenset[CellRole] = TRAINING_ROLES
_SWITCHING: frozenset[CellRole] = frozenset({"draining", "switching"})

# How the report names the cell aggregate's refusals (``evolve_cell``'s reasons).
_CELL_ANOMALIES = {
    "duplicate-cell": "cell registered twice",
    "invalid-cell": "cell registered with negative capacity or gpus",
    "unknown-cell": "event of an unregistered cell",
    "wrong-role": "role change from a role the cell did not hold",
    "illegal-transition": "role change outside the role-change protocol",
    "resident-never-trains": "resident cell turned to training",
}

_TASK_ANOMALIES = {
    "duplicate-task": "task synthesized twice",
    "unknown-task": "event of an unknown task",
    "unknown-task-version": "verdict on an unknown task version",
    "stale-version": "hardening of a task version that is not current",
    "duplicate-task-version": "task version synthesized twice",
}
_EXECUTION_ANOMALIES = {
    "duplicate-execution": "execution dispatched twice",
    "unknown-execution": "execution finished but never dispatched",
    "already-finished": "execution finished twice",
    "invalid-score": "execution finished with a score that is not a number",
    "invalid-call-count": "execution finished with a negative call count",
    "score-on-failure": "execution failed with a score",
}

_E = TypeVar("_E", bound=Event)
_Handler = Callable[["RunFold", Any, int], None]
_FOLDS: dict[type[Event], _Handler] = {}


def _folds(event_type: type[_E]) -> Callable[[Callable[[RunFold, _E, int], None]], Callable[[RunFold, _E, int], None]]:
    """Register a ``RunFold`` method as the fold of ``event_type`` (the registry ``apply`` dispatches through)."""

    def mark(fn: Callable[[RunFold, _E, int], None]) -> Callable[[RunFold, _E, int], None]:
        if event_type in _FOLDS:
            raise TypeError(f"two folds of {event_type.__name__}")
        _FOLDS[event_type] = fn
        return fn

    return mark


def _seconds(ts: datetime) -> float:
    return (ts if ts.tzinfo is not None else ts.replace(tzinfo=UTC)).timestamp()


@dataclass(slots=True)
class _Version:
    patterns: list[PatternUse]
    requested_at: float  # what asked for it: the skill's ingestion, or the too-easy verdict
    made_at: float
    validated_at: float | None = None
    ok: bool | None = None


@dataclass(slots=True)
class _Task:
    skill_id: str
    versions: dict[int, _Version] = field(default_factory=dict)


@dataclass(slots=True)
class _Execution:
    task_id: str
    task_version: int
    step: int
    dispatched_at: float
    finished_at: float | None = None
    status: str = ""
    score: float | None = None


@dataclass(slots=True)
class _Cell:
    node: str
    capacity: int
    resident: bool
    role: CellRole
    since: float
    reason: str
    changes: int = 0


@dataclass(slots=True)
class _Step:
    step: int
    weight_version: str
    at: float
    trained: list[str]
    dropped: list[str]
    loss: float


class RunFold:
    """Fold events in log order with ``apply``; ``summary()`` at any point (it does not consume the fold)."""

    def __init__(self) -> None:
        self.first_seq = 0
        self.last_seq = 0
        self.count = 0
        self.t0: float | None = None
        self.started_at = ""
        self.t_last = 0.0
        self.by_type: Counter[str] = Counter()
        self.anomalies: Counter[str] = Counter()
        self.skills: dict[str, tuple[float, bool]] = {}
        self.tasks: dict[str, _Task] = {}
        self.task_views: dict[str, Task] = {}  # the task aggregate, as every reader folds it
        self.too_easy: dict[tuple[str, int], tuple[float, float]] = {}  # (task, version) -> (at, mean reward)
        self.too_easy_count = 0
        self.hardenings: list[HardeningView] = []
        self.execs: dict[str, _Execution] = {}
        self.exec_views: dict[str, Execution] = {}  # the execution aggregate, as every reader folds it
        self.finished = 0
        self.by_status: Counter[str] = Counter()
        self.by_failure: Counter[str] = Counter()
        self.cells: dict[str, _Cell] = {}
        # The cell aggregate, as every reader folds it (engine changes are not read: a role change's verdict never
        # depends on the engine, and the report shows none).
        self.cell_views: dict[str, Cell] = {}
        self.spans: list[CellSpan] = []  # closed spans; open ones are the cells' current roles
        self.capacity = 0
        self.watermark: list[WatermarkPoint] = []
        self.steps: list[_Step] = []
        self.published: list[tuple[int, str, float]] = []
        self.calls: dict[str, list[int]] = {}  # weight version -> [calls, prompt tokens, output tokens]

    # --- the fold ----------------------------------------------------------------------------------------------

    def apply(self, seq: int, event: Event) -> None:
        at = _seconds(event.occurred_at)
        if self.t0 is None:
            self.t0, self.first_seq, self.started_at = at, seq, event.occurred_at.isoformat()
        self.count += 1
        self.last_seq = max(self.last_seq, seq)
        self.t_last = max(self.t_last, at)
        self.by_type[event.type_name()] += 1
        fold = _FOLDS.get(type(event))
        if fold is not None:
            fold(self, event, seq)

    def apply_all(self, events: Iterable[tuple[int, Event]]) -> RunFold:
        for seq, event in events:
            self.apply(seq, event)
        return self

    def _rel(self, at: float) -> float:
        return at - (self.t0 or at)

    def _mark(self, at: float, seq: int) -> None:
        self.watermark.append(WatermarkPoint(self._rel(at), seq, len(self.execs) - self.finished, self.capacity))

    @_folds(SkillIngested)
    def _skill(self, e: SkillIngested, seq: int) -> None:
        self.skills.setdefault(e.skill_id, (_seconds(e.occurred_at), e.accepted))

    def _evolve_task(self, e: TaskEvent, seq: int) -> bool:
        """The task aggregate's rule; a refused event is an anomaly (with why) and changes nothing."""
        try:
            self.task_views[e.task_id] = evolve_task(self.task_views.get(e.task_id), e, seq)
        except Rejected as exc:
            self.anomalies[_TASK_ANOMALIES.get(exc.reason, exc.reason)] += 1
            return False
        return True

    @_folds(TaskSynthesized)
    def _synthesized(self, e: TaskSynthesized, seq: int) -> None:
        if not self._evolve_task(e, seq):
            return
        at = _seconds(e.occurred_at)
        skill = self.skills.get(e.skill_id)
        self.tasks[e.task_id] = _Task(
            e.skill_id, {e.task_version: _Version(list(e.patterns), skill[0] if skill else at, at)}
        )

    @_folds(TaskValidated)
    def _validated(self, e: TaskValidated, seq: int) -> None:
        if not self._evolve_task(e, seq):
            return
        v = self.tasks[e.task_id].versions[e.task_version]
        v.validated_at, v.ok = _seconds(e.occurred_at), e.ok

    @_folds(TaskTooEasy)
    def _too_easy(self, e: TaskTooEasy, seq: int) -> None:
        if not self._evolve_task(e, seq):
            return
        self.too_easy_count += 1
        self.too_easy[(e.task_id, e.task_version)] = (_seconds(e.occurred_at), e.mean_reward)

    @_folds(TaskHardened)
    def _hardened(self, e: TaskHardened, seq: int) -> None:
        if not self._evolve_task(e, seq):
            return
        at = _seconds(e.occurred_at)
        verdict = self.too_easy.get((e.task_id, e.from_version))
        self.tasks[e.task_id].versions[e.to_version] = _Version(list(e.patterns), verdict[0] if verdict else at, at)
        self.hardenings.append(
            HardeningView(
                e.task_id, e.from_version, e.to_version, self._rel(at), e.bypassed, e.reason,
                verdict[1] if verdict else None,
            )
        )  # fmt: skip

    def _evolve_execution(self, e: ExecutionEvent, seq: int) -> bool:
        """The execution aggregate's rule; a refused event is an anomaly (with why) and changes nothing."""
        try:
            self.exec_views[e.execution_id] = evolve_execution(self.exec_views.get(e.execution_id), e, seq)
        except Rejected as exc:
            self.anomalies[_EXECUTION_ANOMALIES.get(exc.reason, exc.reason)] += 1
            return False
        return True

    @_folds(ExecutionDispatched)
    def _dispatched(self, e: ExecutionDispatched, seq: int) -> None:
        if not self._evolve_execution(e, seq):
            return
        at = _seconds(e.occurred_at)
        self.execs[e.execution_id] = _Execution(e.task_id, e.task_version, e.step, at)
        self._mark(at, seq)

    @_folds(ExecutionFinished)
    def _finished(self, e: ExecutionFinished, seq: int) -> None:
        if not self._evolve_execution(e, seq):
            return
        x = self.execs[e.execution_id]
        x.finished_at, x.status, x.score = _seconds(e.occurred_at), e.status, e.score
        self.finished += 1
        self.by_status[e.status] += 1
        if e.failure_class is not None:
            self.by_failure[e.failure_class] += 1
        self._mark(x.finished_at, seq)

    @_folds(ModelCallRecorded)
    def _call(self, e: ModelCallRecorded, seq: int) -> None:
        row = self.calls.setdefault(e.weight_version, [0, 0, 0])
        row[0] += 1
        row[1] += e.n_prompt_delta
        if not e.weight_versions:
            row[2] += e.n_output
            return
        for span in e.weight_versions:  # the output tokens each version generated, when weights changed mid-call
            self.calls.setdefault(span.version, [0, 0, 0])[2] += max(0, span.end - span.start)

    def _evolve_cell(self, e: CellEvent, seq: int) -> Cell | None:
        """The cell aggregate's rule; a refused event is an anomaly (with why) and changes nothing."""
        try:
            cell = evolve_cell(self.cell_views.get(e.cell_id), e, seq)
        except Rejected as exc:
            self.anomalies[_CELL_ANOMALIES.get(exc.reason, exc.reason)] += 1
            return None
        self.cell_views[e.cell_id] = cell
        return cell

    @_folds(CellRegistered)
    def _registered(self, e: CellRegistered, seq: int) -> None:
        if self._evolve_cell(e, seq) is None:
            return
        at = _seconds(e.occurred_at)
        self.cells[e.cell_id] = _Cell(e.node, e.capacity, e.resident, e.role, at, "registered")
        if e.role in _SERVING:
            self.capacity += e.capacity
        self._mark(at, seq)

    @_folds(CellRoleChanged)
    def _role_changed(self, e: CellRoleChanged, seq: int) -> None:
        if self._evolve_cell(e, seq) is None:
            return
        cell = self.cells[e.cell_id]
        at = _seconds(e.occurred_at)
        self.spans.append(CellSpan(e.cell_id, cell.role, self._rel(cell.since), self._rel(at), cell.reason))
        self.capacity += cell.capacity * ((e.to_role in _SERVING) - (cell.role in _SERVING))
        cell.role, cell.since, cell.reason = e.to_role, at, e.reason
        cell.changes += 1
        self._mark(at, seq)

    @_folds(TrainingStepCompleted)
    def _step(self, e: TrainingStepCompleted, seq: int) -> None:
        trained = list(dict.fromkeys(e.execution_ids))
        seen = set(trained)
        dropped = [x for x in dict.fromkeys(e.dropped) if x not in seen]
        self.steps.append(_Step(e.step, e.weight_version, _seconds(e.occurred_at), trained, dropped, e.loss))

    @_folds(WeightsPublished)
    def _published(self, e: WeightsPublished, seq: int) -> None:
        self.published.append((e.step, e.weight_version, self._rel(_seconds(e.occurred_at))))

    # --- the summary -------------------------------------------------------------------------------------------

    def summary(self) -> RunSummary:
        end = self._rel(self.t_last)
        return RunSummary(
            first_seq=self.first_seq,
            last_seq=self.last_seq,
            events=self.count,
            started_at=self.started_at,
            by_type=dict(sorted(self.by_type.items())),
            skills_accepted=sum(1 for _, ok in self.skills.values() if ok),
            skills_rejected=sum(1 for _, ok in self.skills.values() if not ok),
            tasks=len(self.tasks),
            tasks_validated=sum(1 for t in self.tasks.values() if t.versions.get(1) and t.versions[1].ok),
            tasks_rejected=sum(1 for t in self.tasks.values() if t.versions.get(1) and t.versions[1].ok is False),
            too_easy=self.too_easy_count,
            hardenings=list(self.hardenings),
            executions=self._tally(),
            steps=[self._step_rewards(s) for s in self.steps],
            rewards_by_batch=self._by_batch(),
            cells=[
                CellView(cid, c.node, c.capacity, c.resident, c.role, self._rel(c.since), c.changes)
                for cid, c in self.cells.items()
            ],
            cell_spans=self._all_spans(),
            watermark=list(self.watermark),
            difficulty=self._difficulty(),
            time=self._time_split(end),
            weight_versions=[VersionCalls(v, *row) for v, row in sorted(self.calls.items())],
            published=list(self.published),
            notes=self._notes(),
            anomalies=dict(sorted(self.anomalies.items())),
            cell_use=self._cell_use(),
        )

    def _cell_use(self) -> CellUse | None:
        """``CellUse`` over [first dispatch, last training step]: one sweep over the moments anything changes
        (roles, executions in flight, steps running)."""
        if not self.execs or not self.steps or not self.cells:
            return None
        lo = min(self._rel(x.dispatched_at) for x in self.execs.values())
        hi = max(self._rel(s.at) for s in self.steps)
        if hi <= lo:
            return None
        # (at, kind, cell, change, role); kind 0: the cell's role from here on, 1: in flight, 2: steps running.
        changes: list[tuple[float, int, str, int, CellRole | None]] = []
        for span in self._all_spans():
            changes.append((span.start_s, 0, span.cell_id, 0, span.role))
        for x in self.execs.values():
            changes.append((self._rel(x.dispatched_at), 1, "", 1, None))
            if x.finished_at is not None:
                changes.append((self._rel(x.finished_at), 1, "", -1, None))
        for st in self.steps:
            ends = [self.execs[x].finished_at for x in (*st.trained, *st.dropped) if x in self.execs]
            known = [t for t in ends if t is not None]
            if known and len(known) == len(ends) and max(known) < st.at:
                changes.append((self._rel(max(known)), 2, "", 1, None))
                changes.append((self._rel(st.at), 2, "", -1, None))
        changes.sort(key=lambda c: (c[0], c[1]))
        role: dict[str, CellRole | None] = dict.fromkeys(self.cells)
        acc = [0.0] * 6  # rollout busy, rollout idle, training busy, training idle, switching, unassigned
        inflight = running = 0
        prev = lo

        def add(upto: float) -> None:
            dt = min(upto, hi) - max(prev, lo)
            if dt <= 0:
                return
            serving = slots = training = 0
            for cid, r in role.items():
                if r in _SERVING:
                    serving += 1
                    slots += max(self.cells[cid].capacity, 1)
                elif r in _TRAINING:
                    training += 1
                elif r in _SWITCHING:
                    acc[4] += dt
                else:
                    acc[5] += dt
            if serving:  # executions fill the serving cells' slots (the share of them held is busy)
                used = serving * min(inflight, slots) / slots
                acc[0] += used * dt
                acc[1] += (serving - used) * dt
            busy = min(training, 1) if running > 0 else 0
            acc[2] += busy * dt
            acc[3] += (training - busy) * dt

        for at, kind, cid, change, to_role in changes:
            add(at)
            prev = max(prev, at)
            if kind == 0:
                role[cid] = to_role
            elif kind == 1:
                inflight += change
            else:
                running += change
        add(hi)
        total = len(self.cells) * (hi - lo)
        return CellUse(hi - lo, len(self.cells), *(a / total for a in acc))

    def _tally(self) -> ExecutionTally:
        scores = [x.score for x in self.execs.values() if x.score is not None]
        return ExecutionTally(
            dispatched=len(self.execs),
            running=len(self.execs) - self.finished,
            finished=self.finished,
            by_status=dict(sorted(self.by_status.items())),
            by_failure_class=dict(sorted(self.by_failure.items())),
            scored=len(scores),
            reward_mean=sum(scores) / len(scores) if scores else None,
        )

    def _step_rewards(self, s: _Step) -> StepRewards:
        scores: list[float] = []
        unscored = unfinished = 0
        for xid in (*s.trained, *s.dropped):
            x = self.execs.get(xid)
            if x is None or x.finished_at is None:
                unfinished += 1
            elif x.score is None:
                unscored += 1
            else:
                scores.append(x.score)
        return StepRewards(
            s.step, s.weight_version, self._rel(s.at), len(scores),
            sum(scores) / len(scores) if scores else None, min(scores, default=None), max(scores, default=None),
            len(s.trained), len(s.dropped), unscored, unfinished, s.loss,
        )  # fmt: skip

    def _by_batch(self) -> dict[int, tuple[int, float]]:
        acc: dict[int, list[float]] = {}
        for x in self.execs.values():
            if x.score is not None:
                acc.setdefault(x.step, []).append(x.score)
        return {k: (len(v), sum(v) / len(v)) for k, v in sorted(acc.items())}

    def _all_spans(self) -> list[CellSpan]:
        open_ = [CellSpan(cid, c.role, self._rel(c.since), None, c.reason) for cid, c in self.cells.items()]
        return sorted([*self.spans, *open_], key=lambda s: (s.cell_id, s.start_s))

    def _difficulty(self) -> list[RoundDifficulty]:
        knobs: dict[int, dict[str, list[float]]] = {}
        counts: dict[int, list[int]] = {}  # round -> [task versions, pattern instances]
        for task in self.tasks.values():
            for v, ver in task.versions.items():
                c = counts.setdefault(v, [0, 0])
                c[0] += 1
                c[1] += len(ver.patterns)
                for p in ver.patterns:
                    for k, value in p.knobs.items():
                        knobs.setdefault(v, {}).setdefault(f"{p.pattern_id}.{k}", []).append(value)
        rewards: dict[int, list[float]] = {}
        for x in self.execs.values():
            if x.score is not None:
                rewards.setdefault(x.task_version, []).append(x.score)
        out = []
        for r in sorted(set(counts) | set(rewards)):
            n, patterns = counts.get(r, [0, 0])
            got = rewards.get(r, [])
            means = {k: sum(vs) / len(vs) for k, vs in sorted(knobs.get(r, {}).items())}
            out.append(
                RoundDifficulty(r, n, patterns / n if n else 0.0, means, len(got), sum(got) / len(got) if got else None)
            )
        return out

    def _time_split(self, end: float) -> TimeSplit:
        synth = [
            (self._rel(v.requested_at), self._rel(v.validated_at if v.validated_at is not None else v.made_at))
            for t in self.tasks.values()
            for v in t.versions.values()
        ]
        rollout = [
            (self._rel(x.dispatched_at), self._rel(x.finished_at) if x.finished_at is not None else end)
            for x in self.execs.values()
        ]
        spans = self._all_spans()
        cell_seconds: dict[str, float] = {}
        for s in spans:
            cell_seconds[s.role] = cell_seconds.get(s.role, 0.0) + max(
                0.0, (s.end_s if s.end_s is not None else end) - s.start_s
            )

        def of(roles: frozenset[CellRole]) -> float | None:
            if not self.cells:
                return None
            return _union([(s.start_s, s.end_s if s.end_s is not None else end) for s in spans if s.role in roles])

        return TimeSplit(
            span_s=end,
            synthesis_s=_union(synth) if synth else None,
            rollout_s=_union(rollout) if rollout else None,
            training_s=of(_TRAINING),
            switching_s=of(_SWITCHING),
            cell_seconds=dict(sorted(cell_seconds.items())),
        )

    def _notes(self) -> list[str]:
        notes = []
        if self.first_seq > 1 and self.anomalies:
            notes.append(
                f"the range read starts at seq {self.first_seq}: events about executions, cells or tasks that began "
                "before it are counted under anomalies"
            )
        if not self.execs:
            notes.append("no execution-dispatched events: executions, rewards and the watermark w(t) are not shown")
        if not self.cells:
            notes.append(
                "no cell-registered events: cell roles, rollout capacity CR(t), training and switching time unknown"
            )
        elif self.steps and not any(s.role in _TRAINING for s in self._all_spans()):
            notes.append(
                "training steps completed but no cell entered a training role in the log: training time is not "
                "shown (a step's event carries no start time)"
            )
        if not self.tasks:
            notes.append("no task-synthesized events: task difficulty and synthesis time unknown")
        elif not any(p.knobs for t in self.tasks.values() for v in t.versions.values() for p in v.patterns):
            notes.append("the tasks' patterns set no knobs: difficulty per round shows pattern counts only")
        if not self.steps:
            notes.append("no training-step-completed events: no reward per training step")
        return notes


def _union(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals."""
    total, cur_s, cur_e = 0.0, 0.0, None
    for s, e in sorted((s, max(s, e)) for s, e in intervals):  # producers' clocks may disagree a little
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return max(0.0, total)


FOLDED_TYPES: tuple[type[Event], ...] = tuple(_FOLDS)


def fold_events(events: Iterable[tuple[int, Event]]) -> RunSummary:
    """The summary of ``(seq, event)`` pairs in log order."""
    return RunFold().apply_all(events).summary()
