"""The hardening loop: a projection over execution results, the diagnosis and the proposal.

``HardeningProjection`` folds ``execution-dispatched`` (which task version an execution runs), the executions'
recorded model calls (their tool calls: what the solver did) and ``execution-finished`` (the score) into a
window of the last ``window`` valid rewards per task version; a version whose windowed mean exceeds
``threshold`` is flagged, once. ``task-too-easy`` and ``task-hardened`` fold back so a version is handled once.
The fold is pure (values only from events and rows), so a rebuild gives the same rows.

``diagnose`` compares the trajectories with the blueprint: a challenge whose evidence the solvers read only in part
while scoring high was bypassed (evidence read from one file where the pattern split it across N); ``propose``
raises that pattern instance's knob or, at its top level, adds a compatible pattern of the same dimension. With a
synthesis model configured, the model diagnoses instead (``_diagnose_llm``), this heuristic its fallback.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import msgspec
from sqlalchemy import Boolean, Connection, Float, Integer, String, Table, Text, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.events import (
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TaskHardened,
    TaskTooEasy,
)
from opengyre.projection import Projection, folds
from opengyre.store import STREAM_SEQ, Base

from ._blueprint import Blueprint, Challenge, fill_contract, materials
from ._catalogue import get_pattern, pattern_ids
from ._synth import procedural_goal

__all__ = ["Diagnosis", "HardeningProjection", "coverage", "diagnose", "propose"]


class ExecutionRow(Base):
    __tablename__ = "synth_executions"

    execution_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_id: Mapped[str] = mapped_column(String(128))
    task_version: Mapped[int] = mapped_column(Integer)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    actions: Mapped[str] = mapped_column(Text)  # JSON list: the tool calls' arguments, in order
    updated_seq: Mapped[int] = mapped_column(STREAM_SEQ)


class WindowRow(Base):
    __tablename__ = "synth_windows"

    task_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    task_version: Mapped[int] = mapped_column(Integer, primary_key=True)
    rewards: Mapped[str] = mapped_column(Text)  # JSON list, the last ``window`` valid scores
    n: Mapped[int] = mapped_column(Integer)  # valid scores seen in all
    mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    flagged_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)
    too_easy_seq: Mapped[int | None] = mapped_column(STREAM_SEQ, nullable=True)
    hardened: Mapped[bool] = mapped_column(Boolean)
    updated_seq: Mapped[int] = mapped_column(STREAM_SEQ)


_E: Table = ExecutionRow.__table__  # type: ignore[assignment]
_W: Table = WindowRow.__table__  # type: ignore[assignment]
_MAX_ACTIONS = 200  # per execution: enough for a diagnosis, bounded for the store


class HardeningProjection(Projection):
    name = "hardening"
    aggregates = ("execution", "task")

    def __init__(self, window: int = 8, threshold: float = 0.7) -> None:
        if window < 1 or not 0.0 <= threshold < 1.0:
            raise ValueError("window must be >= 1 and threshold in [0, 1)")
        self.window, self.threshold = window, threshold

    @property
    def tables(self) -> Sequence[Table]:
        return (_E, _W)

    @folds(ExecutionDispatched)
    def _dispatched(self, tx: Connection, e: ExecutionDispatched, seq: int) -> None:
        if not tx.execute(select(_E.c.execution_id).where(_E.c.execution_id == e.execution_id)).first():
            tx.execute(
                insert(_E).values(
                    execution_id=e.execution_id,
                    task_id=e.task_id,
                    task_version=e.task_version,
                    score=None,
                    actions="[]",
                    updated_seq=seq,
                )
            )

    @folds(ModelCallRecorded)
    def _call(self, tx: Connection, e: ModelCallRecorded, seq: int) -> None:
        row = tx.execute(select(_E.c.actions).where(_E.c.execution_id == e.execution_id)).first()
        if row is None or not e.tool_calls:
            return
        actions = json.loads(row.actions)
        actions += [str(tc.arguments) for tc in e.tool_calls][: max(0, _MAX_ACTIONS - len(actions))]
        tx.execute(
            update(_E).where(_E.c.execution_id == e.execution_id).values(actions=json.dumps(actions), updated_seq=seq)
        )

    @folds(ExecutionFinished)
    def _finished(self, tx: Connection, e: ExecutionFinished, seq: int) -> None:
        ex = tx.execute(select(_E).where(_E.c.execution_id == e.execution_id)).first()
        if ex is None or e.score is None:
            return  # not one of ours, or no valid score (an evaluator or infrastructure failure): no signal
        tx.execute(update(_E).where(_E.c.execution_id == e.execution_id).values(score=e.score, updated_seq=seq))
        self._reward(tx, ex.task_id, ex.task_version, float(e.score), seq)

    @folds(TaskTooEasy)
    def _too_easy(self, tx: Connection, e: TaskTooEasy, seq: int) -> None:
        self._window(tx, e.task_id, e.task_version, seq)
        tx.execute(
            update(_W)
            .where(_W.c.task_id == e.task_id, _W.c.task_version == e.task_version)
            .values(too_easy_seq=seq, updated_seq=seq)
        )

    @folds(TaskHardened)
    def _hardened(self, tx: Connection, e: TaskHardened, seq: int) -> None:
        self._window(tx, e.task_id, e.from_version, seq)
        tx.execute(
            update(_W)
            .where(_W.c.task_id == e.task_id, _W.c.task_version == e.from_version)
            .values(hardened=True, updated_seq=seq)
        )

    def _window(self, tx: Connection, task_id: str, version: int, seq: int) -> WindowRow:
        row = tx.execute(select(_W).where(_W.c.task_id == task_id, _W.c.task_version == version)).first()
        if row is None:
            tx.execute(
                insert(_W).values(
                    task_id=task_id,
                    task_version=version,
                    rewards="[]",
                    n=0,
                    mean=None,
                    flagged_seq=None,
                    too_easy_seq=None,
                    hardened=False,
                    updated_seq=seq,
                )
            )
            row = tx.execute(select(_W).where(_W.c.task_id == task_id, _W.c.task_version == version)).first()
        return row  # type: ignore[return-value]

    def _reward(self, tx: Connection, task_id: str, version: int, score: float, seq: int) -> None:
        w = self._window(tx, task_id, version, seq)
        rewards = ([*json.loads(w.rewards), score])[-self.window :]
        mean = sum(rewards) / len(rewards)
        flag = w.flagged_seq
        if flag is None and len(rewards) >= self.window and mean > self.threshold:
            flag = seq
        tx.execute(
            update(_W)
            .where(_W.c.task_id == task_id, _W.c.task_version == version)
            .values(rewards=json.dumps(rewards), n=w.n + 1, mean=round(mean, 9), flagged_seq=flag, updated_seq=seq)
        )


@dataclass(frozen=True)
class Diagnosis:
    cid: str
    pattern_id: str
    coverage: float  # mean share of the challenge's evidence the solvers touched
    reason: str


def _touched(actions: Iterable[str], evidence: Sequence[str]) -> float:
    text = "\n".join(actions)
    if not evidence:
        return 1.0
    hits = 0
    for path in evidence:
        # A path counts as read when the trajectory names it, or names its folder with a wildcard/recursive tool.
        folder = path.rsplit("/", 1)[0]
        if path in text or re.search(re.escape(folder) + r"(/\*|/?\s|/?$|\s-r|/\.\.\.)", text):
            hits += 1
    return hits / len(evidence)


def coverage(evidence: Sequence[str], trajectories: Sequence[Sequence[str]]) -> float:
    """The mean share of ``evidence`` files the trajectories' actions named."""
    return sum(_touched(t, evidence) for t in trajectories) / max(len(trajectories), 1)


def diagnose(bp: Blueprint, trajectories: Sequence[Sequence[str]]) -> Diagnosis:
    """The pattern instance the solvers bypassed: the one whose evidence they read least."""
    best: Diagnosis | None = None
    for c, m in materials(bp):
        cov = coverage(m.evidence, trajectories)
        if best is None or cov < best.coverage:
            why = (
                f"{c.cid} ({c.pattern_id}) scored while the solvers read {cov:.0%} of its {len(m.evidence)} "
                "evidence file(s)"
            )
            best = Diagnosis(c.cid, c.pattern_id, cov, why)
    assert best is not None  # a blueprint has at least one challenge
    if best.coverage >= 1.0:  # nothing skipped: the challenge with the most headroom is simply too weak
        c = max(bp.challenges, key=lambda c: _headroom(c))
        best = Diagnosis(c.cid, c.pattern_id, 1.0, f"{c.cid} ({c.pattern_id}) solved in full: raise its strength")
    return best


def _headroom(c: Challenge) -> int:
    p = get_pattern(c.pattern_id)
    return len(p.knobs[p.primary]) - 1 - p.knobs[p.primary].index(c.knobs[p.primary])


def propose(bp: Blueprint, d: Diagnosis) -> tuple[Blueprint, str]:
    """The next version: the bypassed instance's knob one level up (primary first), or, with every knob at its
    top, a compatible pattern of the same dimension added at its first level."""
    challenges = list(bp.challenges)
    i = next(k for k, c in enumerate(challenges) if c.cid == d.cid)
    c = challenges[i]
    p = get_pattern(c.pattern_id)
    reason = ""
    for knob in [p.primary, *sorted(k for k in p.knobs if k != p.primary)]:
        levels = p.knobs[knob]
        at = levels.index(c.knobs[knob])
        if at + 1 < len(levels):
            challenges[i] = msgspec.structs.replace(c, knobs={**c.knobs, knob: levels[at + 1]})
            reason = f"raise {c.cid} ({c.pattern_id}) {knob} {levels[at]} -> {levels[at + 1]}: {d.reason}"
            break
    else:
        used = {x.pattern_id for x in challenges}
        same = [q for q in pattern_ids(p.dimension) if q not in used]
        fits = [q for q in same if bp.domain and bp.domain in get_pattern(q).domains]  # the skill's domain first
        pool = fits or same or [q for q in pattern_ids() if q not in used]
        if not pool:
            raise ValueError(f"task {bp.task_id}: every pattern is in use at its top level; nothing left to raise")
        new = get_pattern(pool[bp.version % len(pool)])
        cid = f"c{len(challenges)}"
        challenges.append(Challenge(cid=cid, pattern_id=new.id, knobs={k: v[0] for k, v in new.knobs.items()}))
        reason = f"add {cid} ({new.id}, {new.dimension}): {c.cid} ({c.pattern_id}) is at its top level; {d.reason}"
    goal = bp.goal
    if goal == procedural_goal(bp.skill_name, [x.pattern_id for x in bp.challenges]):
        goal = procedural_goal(bp.skill_name, [x.pattern_id for x in challenges])  # says the added challenge too
    # A version built before in the layout that names patterns in folder names is rebuilt without it.
    nxt = msgspec.structs.replace(
        bp, version=bp.version + 1, parent_version=bp.version, challenges=challenges, layout="cid", goal=goal
    )
    return fill_contract(nxt), reason
