"""`opengyre demo`: the stack comes up, a scripted burst of events goes in, projections catch up, and a
replay from the log matches them row for row."""

from __future__ import annotations

import asyncio
import random
import uuid
from typing import Annotated

import grpc
import typer
from rich.progress import BarColumn, Progress, TextColumn

from ..config import Settings
from ..eventlog import EventLog, LogUnavailable
from ..events import (
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
from ..runtime import DataDirBusy, DataDirUnusable, PortTaken, Stack, all_projections
from ..v1 import common_pb2
from ._common import DataDirOpt, console, fail, settings_from
from ._replay import replay_compare

__all__ = ["register", "scripted_burst"]


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


async def _pending(stack: Stack) -> int:
    total = 0
    for name, child in stack.children.items():
        stub_mod = __import__(f"opengyre.v1.{name}_pb2_grpc", fromlist=["x"])
        stub = getattr(stub_mod, f"{name.capitalize()}ServiceStub")
        async with grpc.aio.insecure_channel(f"{stack.settings.host}:{child.port}") as ch:
            st = await stub(ch).GetStatus(common_pb2.StatusRequest(), timeout=5)
        total += sum(p.pending for p in st.projections)
    return total


async def _demo(settings: Settings, seed: int) -> None:
    stack = Stack(settings)
    console.rule("[bold]1. opengyre up[/]")
    await stack.start()
    try:
        console.print(
            f"event log {stack.nats_url}, stores {', '.join(sorted(set(settings.store_urls().values())))}, "
            f"services: {', '.join(stack.children)}"
        )
        log = await EventLog.connect(stack.nats_url, settings.log)
        try:
            console.rule("[bold]2. a scripted burst of events[/]")
            run = uuid.uuid4().hex[:6]
            burst = scripted_burst(seed, run)
            first = await log.last_seq() + 1
            await log.append_many(burst)
            # Two messages no service can use: they are dead-lettered with a reason, and block nothing.
            await log.nc.publish(
                log.config.subject("execution", f"{run}-bad"), b"{not json", headers={"Og-Type": "execution-finished"}
            )
            await log.nc.publish(
                log.config.subject("task", f"{run}-new"), b"{}", headers={"Og-Type": "task-from-the-future"}
            )
            await log.nc.flush()
            last = await log.last_seq()
            console.print(f"published {len(burst)} events (+2 undecodable ones) as seq {first}..{last}")
            console.rule("[bold]3. projections catch up[/]")
            with Progress(
                TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}")
            ) as bar:
                total = last - first + 1
                t = bar.add_task("events applied", total=total)
                for _ in range(600):
                    pending = await _pending(stack)
                    bar.update(t, completed=max(0, total - pending))
                    if pending == 0:
                        break
                    await asyncio.sleep(0.1)
            console.rule("[bold]4. replay from the log matches the live projections[/]")
            ok = True
            for proj in all_projections().values():
                rows, same, n = await replay_compare(proj, log, settings, None)
                count = sum(len(v) for v in rows.values())
                mark = "[green]✓ matches[/]" if same else "[red]✗ differs[/]"
                console.print(f"{proj.name:12} replayed {n} events into {count} rows: {mark}")
                ok = ok and bool(same)
            if not ok:
                raise typer.Exit(1)
            console.print("\nTry: [bold]opengyre events tail[/], [bold]opengyre replay -p scheduler --until-seq 40[/]")
        finally:
            await log.close()
    finally:
        console.rule("[bold]5. opengyre down[/]")
        await stack.stop()


def demo(
    data_dir: DataDirOpt = None,
    seed: Annotated[int, typer.Option(help="Seed of the scripted burst")] = 7,
) -> None:
    """Run the main job on the embedded default stack (until the closed loop lands: the event backbone)."""
    settings = settings_from(data_dir)
    try:
        asyncio.run(_demo(settings, seed))
    except (LogUnavailable, DataDirBusy, DataDirUnusable, PortTaken) as exc:
        raise fail(str(exc)) from exc


def register(app: typer.Typer) -> None:
    app.command()(demo)
