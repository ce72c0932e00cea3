"""The task catalogue: skills ingested, tasks synthesized, validated, found too easy and hardened."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Boolean, Connection, Float, Integer, String, Table, Text, insert, select, update
from sqlalchemy.orm import Mapped, mapped_column

from opengyre.events import Event, SkillIngested, TaskHardened, TaskSynthesized, TaskTooEasy, TaskValidated
from opengyre.projection import Projection, Rejected
from opengyre.store import STREAM_SEQ, Base

__all__ = ["SkillRow", "TaskRow", "TasksProjection"]


class SkillRow(Base):
    __tablename__ = "synth_skills"

    skill_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(String(128))
    ingested_seq: Mapped[int] = mapped_column(STREAM_SEQ)


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


_S: Table = SkillRow.__table__  # type: ignore[assignment]
_T: Table = TaskRow.__table__  # type: ignore[assignment]


class TasksProjection(Projection):
    name = "tasks"
    aggregates = ("skill", "task")

    @property
    def tables(self) -> Sequence[Table]:
        return (_T, _S)

    def apply(self, tx: Connection, event: Event, seq: int) -> None:
        if isinstance(event, SkillIngested):
            row = {"name": event.name, "description": event.description, "digest": event.digest, "ingested_seq": seq}
            if tx.execute(select(_S.c.skill_id).where(_S.c.skill_id == event.skill_id)).first():
                tx.execute(update(_S).where(_S.c.skill_id == event.skill_id).values(**row))
            else:
                tx.execute(insert(_S).values(skill_id=event.skill_id, **row))
        elif isinstance(event, TaskSynthesized):
            if tx.execute(select(_T.c.task_id).where(_T.c.task_id == event.task_id)).first():
                raise Rejected(f"task {event.task_id} already exists")
            tx.execute(
                insert(_T).values(
                    task_id=event.task_id,
                    skill_id=event.skill_id,
                    task_version=event.task_version,
                    validated=None,
                    too_easy_count=0,
                    last_mean_reward=None,
                    hardened_count=0,
                    updated_seq=seq,
                )
            )
        elif isinstance(event, TaskValidated):
            self._update(tx, event.task_id, seq, validated=event.ok)
        elif isinstance(event, TaskTooEasy):
            cur = self._current(tx, event.task_id)
            self._update(
                tx, event.task_id, seq, too_easy_count=cur.too_easy_count + 1, last_mean_reward=event.mean_reward
            )
        elif isinstance(event, TaskHardened):
            cur = self._current(tx, event.task_id)
            if cur.task_version != event.from_version:
                raise Rejected(f"task {event.task_id} is at v{cur.task_version}, not v{event.from_version}")
            self._update(
                tx,
                event.task_id,
                seq,
                task_version=event.to_version,
                hardened_count=cur.hardened_count + 1,
                validated=None,
            )

    @staticmethod
    def _current(tx: Connection, task_id: str) -> TaskRow:
        row = tx.execute(select(_T).where(_T.c.task_id == task_id)).first()
        if row is None:
            raise Rejected(f"unknown task {task_id}")
        return row  # type: ignore[return-value]

    def _update(self, tx: Connection, task_id: str, seq: int, **values: object) -> None:
        res = tx.execute(update(_T).where(_T.c.task_id == task_id).values(updated_seq=seq, **values))
        if res.rowcount != 1:
            raise Rejected(f"unknown task {task_id}")
