"""The task aggregate: ``task-synthesized``, ``task-validated``, ``task-too-easy`` and ``task-hardened`` folded
into a :class:`Task` by one rule, the owner's (synth's), which every reader applies unchanged:

- a task is synthesized once (``duplicate-task``); any later event of a task never synthesized is refused
  (``unknown-task``);
- a validation or a too-easy verdict is about a version the task has (``unknown-task-version``);
- a hardening starts from the task's current version (``stale-version``) and makes a version it does not have yet
  (``duplicate-task-version``), which becomes current.

A refused event raises :class:`~opengyre.projection.Rejected` with that reason and leaves the task as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opengyre.events import Event, TaskHardened, TaskSynthesized, TaskTooEasy, TaskValidated
from opengyre.projection import Rejected

__all__ = ["TASK_EVENTS", "Task", "TaskEvent", "evolve_task"]

TaskEvent = TaskSynthesized | TaskValidated | TaskTooEasy | TaskHardened
TASK_EVENTS: tuple[type[TaskEvent], ...] = (TaskSynthesized, TaskValidated, TaskTooEasy, TaskHardened)


@dataclass(frozen=True, slots=True)
class Task:
    task_id: str
    skill_id: str
    version: int  # the current version: the one executions run and a hardening starts from
    versions: frozenset[int]  # every version the task has


def evolve_task(task: Task | None, event: TaskEvent, seq: int = 0) -> Task:
    """The task after ``event`` (``task``: before it, None if never synthesized); raises Rejected by the rule
    above. Pure: the result depends on the arguments only."""
    if task is None and not isinstance(event, TaskSynthesized):
        raise Rejected(f"unknown task {event.task_id}", reason="unknown-task")
    return _FOLDS[type(event)](task, event)


def _synthesized(task: Task | None, e: TaskSynthesized) -> Task:
    if task is not None:
        raise Rejected(f"task {e.task_id} already exists", reason="duplicate-task")
    return Task(e.task_id, e.skill_id, e.task_version, frozenset({e.task_version}))


def _about_a_version(task: Task, e: TaskValidated | TaskTooEasy) -> Task:
    if e.task_version not in task.versions:
        raise Rejected(f"task {e.task_id} has no v{e.task_version}", reason="unknown-task-version")
    return task


def _hardened(task: Task, e: TaskHardened) -> Task:
    if task.version != e.from_version:
        raise Rejected(f"task {e.task_id} is at v{task.version}, not v{e.from_version}", reason="stale-version")
    if e.to_version in task.versions:
        raise Rejected(f"task {e.task_id} v{e.to_version} already exists", reason="duplicate-task-version")
    return replace(task, version=e.to_version, versions=task.versions | {e.to_version})


_FOLDS: dict[type[Event], Callable[[Any, Any], Task]] = {
    TaskSynthesized: _synthesized,
    TaskValidated: _about_a_version,
    TaskTooEasy: _about_a_version,
    TaskHardened: _hardened,
}
