"""The task catalogue: skills ingested (or rejected, with why), tasks synthesized, validated, found too easy and
hardened; every task version with its parent (the lineage)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import msgspec
from sqlalchemy import Boolean, Connection, Float, Integer, String, Table, Text, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.aggregates import Task, evolve_task
from opengyre.events import PatternUse, SkillIngested, TaskHardened, TaskSynthesized, TaskTooEasy, TaskValidated
from opengyre.projection import Projection, folds
from opengyre.store import STREAM_SEQ, Base

__all__ = ["SkillRow", "TaskRow", "TaskVersionRow", "TasksProjection", "current_tasks", "task_lineage"]


class SkillRow(Base):
    __tablename__ = "synth_skills"

    skill_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(128))
    ingested_seq: Mapped[int] = mapped_column(STREAM_SEQ)
    accepted: Mapped[bool] = mapped_column(Boolean, server_default="1")
    reason: Mapped[str] = mapped_column(Text, server_default="")
    capabilities: Mapped[str] = mapped_column(Text, server_default="{}")  # JSON, the five dimensions


class TaskRow(Base):
    __tablename__ = "synth_tasks"

    task_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    skill_id: Mapped[str] = mapped_column(String(128))
    task_version: Mapped[int] = mapped_column(Integer)
    validated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    too_easy_count: Mapped[int] = mapped_column(Integer)
    last_mean_reward: Mapped[float | None] = mapped_column(Float, nullable=True)
    hardened_count: Mapped[int] = mapped_column(Integer)
    updated_seq: Mapped[int] = mapped_column(STREAM_SEQ)


class TaskVersionRow(Base):
    __tablename__ = "synth_task_versions"

    task_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    parent_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    patterns: Mapped[str] = mapped_column(Text)  # JSON [{pattern_id, knobs}]
    task_dir: Mapped[str] = mapped_column(Text)
    reason: Mapped[str] = mapped_column(Text)  # why this version exists (synthesized, or the hardening's reason)
    validated: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    checks: Mapped[str] = mapped_column(Text)  # JSON {gate: reason}
    created_seq: Mapped[int] = mapped_column(STREAM_SEQ)


_S: Table = SkillRow.__table__  # type: ignore[assignment]
_V: Table = TaskVersionRow.__table__  # type: ignore[assignment]
_T: Table = TaskRow.__table__  # type: ignore[assignment]


class TasksProjection(Projection):
    name = "tasks"
    aggregates = ("skill", "task")

    @property
    def tables(self) -> Sequence[Table]:
        return (_T, _S, _V)

    @folds(SkillIngested)
    def _skill(self, tx: Connection, e: SkillIngested, seq: int) -> None:
        row = {
            "name": e.name,
            "description": e.description,
            "digest": e.digest,
            "ingested_seq": seq,
            "accepted": e.accepted,
            "reason": e.reason,
            "capabilities": json.dumps(e.capabilities, sort_keys=True),
        }
        if tx.execute(select(_S.c.skill_id).where(_S.c.skill_id == e.skill_id)).first():
            tx.execute(update(_S).where(_S.c.skill_id == e.skill_id).values(**row))
        else:
            tx.execute(insert(_S).values(skill_id=e.skill_id, **row))
        # The same skill re-ingested, changed (another digest, so another id) or now rejected: its earlier versions
        # are stale, and neither they nor their tasks are offered any more (BuildTasks, ListTasks).
        tx.execute(
            update(_S)
            .where(_S.c.name == e.name, _S.c.skill_id != e.skill_id, _S.c.accepted.is_(True))
            .values(accepted=False, reason=f"superseded by {e.skill_id}", ingested_seq=seq)
        )

    @folds(TaskSynthesized)
    def _synthesized(self, tx: Connection, e: TaskSynthesized, seq: int) -> None:
        evolve_task(self._task(tx, e.task_id), e, seq)  # the one rule; it raises Rejected
        tx.execute(
            insert(_T).values(
                task_id=e.task_id,
                skill_id=e.skill_id,
                task_version=e.task_version,
                validated=None,
                too_easy_count=0,
                last_mean_reward=None,
                hardened_count=0,
                updated_seq=seq,
            )
        )
        self._version(tx, e.task_id, e.task_version, None, e.patterns, e.task_dir, "synthesized", seq)

    @folds(TaskValidated)
    def _validated(self, tx: Connection, e: TaskValidated, seq: int) -> None:
        evolve_task(self._task(tx, e.task_id), e, seq)
        cur = self._current(tx, e.task_id)
        if cur.task_version == e.task_version:
            self._update(tx, e.task_id, seq, validated=e.ok)
        checks = json.dumps(e.reasons or {k: str(v) for k, v in e.checks.items()}, sort_keys=True)
        tx.execute(
            update(_V)
            .where(_V.c.task_id == e.task_id, _V.c.version == e.task_version)
            .values(validated=e.ok, checks=checks)
        )

    @folds(TaskTooEasy)
    def _too_easy(self, tx: Connection, e: TaskTooEasy, seq: int) -> None:
        evolve_task(self._task(tx, e.task_id), e, seq)
        cur = self._current(tx, e.task_id)
        self._update(tx, e.task_id, seq, too_easy_count=cur.too_easy_count + 1, last_mean_reward=e.mean_reward)

    @folds(TaskHardened)
    def _hardened(self, tx: Connection, e: TaskHardened, seq: int) -> None:
        evolve_task(self._task(tx, e.task_id), e, seq)
        cur = self._current(tx, e.task_id)
        self._update(
            tx, e.task_id, seq, task_version=e.to_version, hardened_count=cur.hardened_count + 1, validated=None
        )
        self._version(tx, e.task_id, e.to_version, e.from_version, e.patterns, e.task_dir, e.reason, seq)

    @staticmethod
    def _version(
        tx: Connection,
        task_id: str,
        version: int,
        parent: int | None,
        patterns: Sequence[PatternUse],
        task_dir: str,
        reason: str,
        seq: int,
    ) -> None:
        tx.execute(
            insert(_V).values(
                task_id=task_id,
                version=version,
                parent_version=parent,
                patterns=json.dumps([msgspec.to_builtins(p) for p in patterns], sort_keys=True),
                task_dir=task_dir,
                reason=reason,
                validated=None,
                checks="{}",
                created_seq=seq,
            )
        )

    @staticmethod
    def _task(tx: Connection, task_id: str) -> Task | None:
        """The task aggregate's view of the task's rows (what ``evolve_task`` reads)."""
        row = tx.execute(select(_T.c.skill_id, _T.c.task_version).where(_T.c.task_id == task_id)).first()
        if row is None:
            return None
        versions = frozenset(v for (v,) in tx.execute(select(_V.c.version).where(_V.c.task_id == task_id)))
        return Task(task_id, row.skill_id, row.task_version, versions)

    @staticmethod
    def _current(tx: Connection, task_id: str) -> TaskRow:
        return tx.execute(select(_T).where(_T.c.task_id == task_id)).one()  # type: ignore[return-value]

    def _update(self, tx: Connection, task_id: str, seq: int, **values: object) -> None:
        tx.execute(update(_T).where(_T.c.task_id == task_id).values(updated_seq=seq, **values))


def current_tasks(conn: Connection) -> list[TaskRow]:
    """The catalogue's tasks whose skill is accepted now: a skill re-ingested changed or rejected drops its tasks."""
    q = select(_T).join(_S, _S.c.skill_id == _T.c.skill_id).where(_S.c.accepted.is_(True)).order_by(_T.c.task_id)
    return list(conn.execute(q))  # type: ignore[arg-type]


def task_lineage(conn: Connection, task_id: str) -> list[TaskVersionRow]:
    """Every version of a task, oldest first, each with its parent version, patterns and gate verdicts."""
    return list(conn.execute(select(_V).where(_V.c.task_id == task_id).order_by(_V.c.version)))  # type: ignore[arg-type]
