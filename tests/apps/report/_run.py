"""A small realistic run written event by event (seeded), and oracles that recompute a report's figures from the
list of events directly, the plain way, independently of the fold under test."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from opengyre.events import (
    CellRegistered,
    CellRole,
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ExecutionStatus,
    FailureClass,
    ModelCallRecorded,
    PatternUse,
    SkillIngested,
    TaskHardened,
    TaskSynthesized,
    TaskTooEasy,
    TaskValidated,
    TrainingStepCompleted,
    WeightSpan,
    WeightsPublished,
)

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@dataclass
class Script:
    """Events with explicit times (seconds after T0), appended in time order."""

    rnd: random.Random
    t: float = 0.0
    events: list[Event] = field(default_factory=list)

    def at(self, dt: float) -> datetime:
        self.t += dt
        return T0 + timedelta(seconds=self.t)

    def add(self, event: Event) -> None:
        self.events.append(event)


def _knobs(rnd: random.Random, level: int) -> list[PatternUse]:
    return [
        PatternUse(pattern_id="distractor", knobs={"count": float(2 * level + rnd.randint(0, 1))}),
        PatternUse(pattern_id="long-chain", knobs={"depth": 3.0 * level + rnd.random(), "fanout": float(level)}),
    ]


def scripted_run(seed: int = 0, *, steps: int = 3, group: int = 4) -> list[Event]:
    """Skills to tasks (one rejected), three cells with one moving to training and back each step, groups of
    ``group`` executions per task and step with every status, model calls under the step's weights, training
    steps consuming what finished (some dropped), weights published, the easiest task hardened each step, and one
    execution-finished for an execution never dispatched (an anomaly the report must count, not fold)."""
    rnd = random.Random(seed)
    s = Script(rnd)
    for k in range(3):
        s.add(SkillIngested(skill_id=f"sk{k}", name=f"skill {k}", description="d", occurred_at=s.at(0.5)))
    s.add(SkillIngested(skill_id="sk-bad", name="bad", description="d", accepted=False, reason="no tests", occurred_at=s.at(0.5)))  # fmt: skip
    versions: dict[str, int] = {}
    for k in range(3):
        tid = f"task{k}"
        s.add(TaskSynthesized(task_id=tid, skill_id=f"sk{k}", patterns=_knobs(rnd, 1), occurred_at=s.at(2.0 + rnd.random())))  # fmt: skip
        ok = k != 2
        s.add(TaskValidated(task_id=tid, ok=ok, reason="" if ok else "reference fails", occurred_at=s.at(3.0 + rnd.random())))  # fmt: skip
        if ok:
            versions[tid] = 1
    cells = {f"c{i}": 4 for i in range(3)}
    for cid, cap in cells.items():
        s.add(CellRegistered(cell_id=cid, capacity=cap, role="rollout", occurred_at=s.at(0.2)))
    weights = "default"
    n = 0
    for step in range(1, steps + 1):
        xids: list[str] = []
        for tid, ver in versions.items():
            for _ in range(group):
                n += 1
                xid = f"x{n}"
                xids.append(xid)
                s.add(ExecutionDispatched(
                    execution_id=xid, task_id=tid, group_id=f"{tid}-s{step}", task_version=ver, step=step,
                    weight_version=weights, group_size=group, occurred_at=s.at(0.1),
                ))  # fmt: skip
        for xid in xids:
            for c in range(rnd.randint(1, 3)):
                spans = [] if rnd.random() < 0.8 else [WeightSpan(version=weights, start=0, end=3), WeightSpan(version="next", start=3, end=7)]  # fmt: skip
                s.add(ModelCallRecorded(
                    execution_id=xid, call_id=f"{xid}-c{c}", prompt_delta_ids=list(range(rnd.randint(5, 40))),
                    output_ids=list(range(7 if spans else rnd.randint(1, 20))), weight_version=weights,
                    weight_versions=spans, occurred_at=s.at(0.05),
                ))  # fmt: skip
        # The first cell leaves rollout while executions run (the watermark allows one cell of 4 out of 12).
        for frm, to in (("rollout", "draining"), ("draining", "switching"), ("switching", "training-core")):
            s.add(CellRoleChanged(cell_id="c0", from_role=frm, to_role=to, reason=f"step {step}", occurred_at=s.at(0.3)))  # fmt: skip
        finished: list[str] = []
        rnd.shuffle(xids)
        for xid in xids:
            status: ExecutionStatus = rnd.choice(["completed"] * 6 + ["timed-out", "evaluator-failed", "infra-failed"])
            score = None if status in ("evaluator-failed", "infra-failed") else round(rnd.random(), 3)
            fc: FailureClass | None = {"timed-out": "timeout", "evaluator-failed": "evaluator", "infra-failed": "oom"}.get(status)  # type: ignore[assignment]  # fmt: skip
            s.add(ExecutionFinished(execution_id=xid, status=status, score=score, failure_class=fc, occurred_at=s.at(1.0 + rnd.random())))  # fmt: skip
            finished.append(xid)
        trained = [x for x in finished[: len(finished) - 2]]
        dropped = {x: "masked:infra:oom" for x in finished[len(finished) - 2 :]}
        weights = f"v{step}"
        s.add(TrainingStepCompleted(
            step=step, weight_version=weights, loss=rnd.random(), n_samples=len(trained), n_tokens=100 * len(trained),
            execution_ids=trained, dropped=dropped, occurred_at=s.at(4.0),
        ))  # fmt: skip
        s.add(WeightsPublished(weight_version=weights, step=step, uri=f"file:///w/{weights}", occurred_at=s.at(0.1)))
        for frm, to in (("training-core", "switching"), ("switching", "rollout")):
            s.add(CellRoleChanged(cell_id="c0", from_role=frm, to_role=to, reason="back", occurred_at=s.at(0.4)))
        easy = sorted(versions)[step % len(versions)]
        ver = versions[easy]
        s.add(TaskTooEasy(task_id=easy, task_version=ver, mean_reward=0.9, n_samples=group, occurred_at=s.at(0.2)))
        s.add(TaskHardened(
            task_id=easy, from_version=ver, to_version=ver + 1, patterns=_knobs(rnd, ver + 1), bypassed="distractor#0",
            reason="too easy", occurred_at=s.at(1.5),
        ))  # fmt: skip
        s.add(TaskValidated(task_id=easy, task_version=ver + 1, ok=True, occurred_at=s.at(2.5)))
        versions[easy] = ver + 1
    s.add(ExecutionFinished(execution_id="ghost", status="completed", score=1.0, occurred_at=s.at(0.1)))
    return s.events


# --- oracles -----------------------------------------------------------------------------------------------------


def secs(e: Event) -> float:
    return (e.occurred_at - T0).total_seconds()


E = TypeVar("E", bound=Event)


def of(events: list[Event], t: type[E]) -> list[E]:
    return [e for e in events if type(e) is t]  # type: ignore[misc]


def scores(events: list[Event]) -> dict[str, float | None]:
    dispatched = {e.execution_id for e in of(events, ExecutionDispatched)}
    return {e.execution_id: e.score for e in of(events, ExecutionFinished) if e.execution_id in dispatched}


def watermark_walk(events: list[Event]) -> list[tuple[int, int]]:
    """(w, CR) after each dispatch, finish of a dispatched execution, registration and role change."""
    running: set[str] = set()
    role: dict[str, CellRole] = {}
    cap: dict[str, int] = {}
    out = []
    for e in events:
        if isinstance(e, ExecutionDispatched):
            running.add(e.execution_id)
        elif isinstance(e, ExecutionFinished):
            if e.execution_id not in running:
                continue
            running.discard(e.execution_id)
        elif isinstance(e, CellRegistered):
            role[e.cell_id], cap[e.cell_id] = e.role, e.capacity
        elif isinstance(e, CellRoleChanged):
            role[e.cell_id] = e.to_role
        else:
            continue
        out.append((len(running), sum(cap[c] for c, r in role.items() if r == "rollout")))
    return out


def covered(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval: a sweep over +1/-1 edges."""
    edges = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda x: (x[0], -x[1]))
    depth, total, since = 0, 0.0, 0.0
    for t, d in edges:
        if depth == 0 and d == 1:
            since = t
        depth += d
        if depth == 0:
            total += t - since
    return total


def status_counts(events: list[Event]) -> Counter[str]:
    dispatched = {e.execution_id for e in of(events, ExecutionDispatched)}
    return Counter(e.status for e in of(events, ExecutionFinished) if e.execution_id in dispatched)


def scored_by(events: list[Event], key: Callable[[ExecutionDispatched], int]) -> dict[int, tuple[int, float]]:
    """key -> (executions with a score, their mean score), over the dispatched executions that finished."""
    score = scores(events)
    acc: dict[int, list[float]] = {}
    for e in of(events, ExecutionDispatched):
        v = score.get(e.execution_id)
        if v is not None:
            acc.setdefault(key(e), []).append(v)
    return {k: (len(v), sum(v) / len(v)) for k, v in sorted(acc.items())}
