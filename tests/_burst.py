"""Test data: a small, deterministic slice of a training burst as events (skills, tasks, cells, executions,
outcomes, a small trajectory tree), for the projection, replay and CLI tests. Not a producer: it plays every
service at once, which only a test may do (the event owners are enforced over libs/ and svc-*/ only)."""

from __future__ import annotations

import random

from opengyre.events import (
    CellRegistered,
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
)

__all__ = ["scripted_burst"]


def scripted_burst(seed: int, run: str, groups: int = 4, group_size: int = 16) -> list[Event]:
    """A small, deterministic slice of a training burst: skills, tasks, cells, executions and outcomes."""
    rng = random.Random(seed)
    events: list[Event] = []
    skills = [("pdf-tools", "Extract text and tables from PDF files."), ("csv-audit", "Audit CSV ledgers for errors.")]
    for name, desc in skills:
        events.append(SkillIngested(skill_id=f"{run}-{name}", name=name, description=desc, source="demo"))
    tasks = []
    for i in range(groups):
        skill = f"{run}-{skills[i % len(skills)][0]}"
        task = f"{run}-task{i}"
        tasks.append(task)
        events.append(
            TaskSynthesized(
                task_id=task,
                skill_id=skill,
                patterns=[PatternUse(pattern_id="distributed-evidence", knobs={"sources": 2 + i})],
            )
        )
        events.append(TaskValidated(task_id=task, ok=True, checks={"noop-fails": True, "reference-passes": True}))
    for c in range(4):
        events.append(CellRegistered(cell_id=f"{run}-cell{c}", capacity=group_size * groups // 4))
    events.extend(_model_calls(rng, f"{run}-g0-e0"))
    events.extend(_model_calls(rng, f"{run}-g0-e1"))
    statuses = ["completed"] * 7 + ["timed-out", "evaluator-failed", "infra-failed"]
    running = []
    for g, task in enumerate(tasks):
        rewards = []
        for k in range(group_size):
            ex = f"{run}-g{g}-e{k}"
            events.append(ExecutionDispatched(execution_id=ex, task_id=task, group_id=f"{run}-g{g}", timeout_s=14400))
            running.append((ex, g))
        rng.shuffle(running)
        for ex, grp in running[: group_size - 2]:
            status = rng.choice(statuses)
            score = round(rng.random(), 3) if status in ("completed", "timed-out") else None
            failure = {"evaluator-failed": "evaluator", "infra-failed": rng.choice(["oom", "sandbox"])}.get(status)
            events.append(ExecutionFinished(execution_id=ex, status=status, score=score, failure_class=failure))  # type: ignore[arg-type]
            if grp == g and score is not None:
                rewards.append(score)
        running = running[group_size - 2 :]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        if mean > 0.5:
            events.append(TaskTooEasy(task_id=task, mean_reward=round(mean, 3), n_samples=len(rewards), threshold=0.5))
            events.append(TaskHardened(task_id=task, from_version=1, to_version=2, reason="raise source count"))
    return events


def _model_calls(rng: random.Random, execution_id: str) -> list[Event]:
    """A small trajectory tree: three extending main calls, then a compaction that forks a summary branch."""
    calls: list[Event] = []
    sizes: dict[str, int] = {}
    parent: str | None = None
    for turn in range(3):
        call = f"{execution_id}-c{turn}"
        delta = [rng.randrange(256) for _ in range(rng.randint(8, 24))]
        out = [rng.randrange(256) for _ in range(rng.randint(4, 12))]
        prefix = sizes[parent] if parent else 0
        calls.append(
            ModelCallRecorded(
                execution_id=execution_id,
                call_id=call,
                parent_call_id=parent,
                prefix_len=prefix,
                prompt_delta_ids=delta,
                output_ids=out,
                output_logprobs=[round(-rng.random(), 4) for _ in out],
                model="tiny",
                weight_version="v0",
            )
        )
        sizes[call] = prefix + len(delta) + len(out)
        parent = call
    root = f"{execution_id}-c0"
    out = [rng.randrange(256) for _ in range(6)]
    calls.append(
        ModelCallRecorded(
            execution_id=execution_id,
            call_id=f"{execution_id}-summary",
            parent_call_id=root,
            prefix_len=4,
            prompt_delta_ids=[rng.randrange(256) for _ in range(10)],
            output_ids=out,
            output_logprobs=[round(-rng.random(), 4) for _ in out],
            role="main-summary",
            model="tiny",
            weight_version="v0",
        )
    )
    return calls
