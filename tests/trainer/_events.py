"""Event scripts for the trainer's projection and loop tests."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

from opengyre.eventlog import EventLog
from opengyre.events import Event, ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.projection import ProjectionRunner
from opengyre.trajectory import split_payload


def calls(execution_id: str, seed: int, version: str = "default") -> list[ModelCallRecorded]:
    """A small branching tree: a root, two main branches, a summary, and a sub-agent."""
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(256) for _ in range(n)]

    def call(cid: str, parent: str | None, prefix: int, nd: int, no: int, role: str = "main") -> ModelCallRecorded:
        return ModelCallRecorded(
            execution_id=execution_id,
            call_id=cid,
            parent_call_id=parent,
            prefix_len=prefix,
            prompt_delta_ids=toks(nd),
            output_ids=toks(no),
            output_logprobs=[-rng.uniform(0.5, 6.0) for _ in range(no)],
            role=role,  # type: ignore[arg-type]
            weight_version=version,
            temperature=1.0,
        )

    return [
        call("c0", None, 0, 10, 6),
        call("c1", "c0", 16, 5, 7),
        call("c2", "c0", 14, 4, 5),
        call("c3", "c1", 20, 3, 4, "main-summary"),
        call("c4", None, 0, 6, 8, "sub-agent"),
    ]


def group(
    gid: str, outcomes: list[tuple[str, float | None, str | None]], version: str = "default", seed: int = 0
) -> list[Event]:
    """Dispatch, calls and finish for each member: (status, score, failure_class)."""
    events: list[Event] = []
    for i, (status, score, fc) in enumerate(outcomes):
        eid = f"{gid}-e{i}"
        events.append(
            ExecutionDispatched(
                execution_id=eid, task_id=f"task-{gid}", group_id=gid, group_size=len(outcomes), weight_version=version
            )
        )
        events += calls(eid, seed * 100 + i, version)
        events.append(ExecutionFinished(execution_id=eid, status=status, score=score, failure_class=fc))  # type: ignore[arg-type]
    return events


@contextlib.asynccontextmanager
async def folding(runner: ProjectionRunner) -> AsyncIterator[ProjectionRunner]:
    """One live runner for a whole test; ``await runner.wait_caught_up()`` whenever the rows must be current.

    (Starting ``run`` again on the same runner deletes and re-creates its durable consumer; nats-server can race
    on that and fail with "meta.inf.tmp: no such file", so tests that fold several times keep one runner.)
    """
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
        yield runner
    finally:
        stop.set()
        await task


async def catch_up(runner: ProjectionRunner) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def append_all(log: EventLog, events: list[Event]) -> None:
    await log.append_many(events)


async def by_reference(log: EventLog, events: list[Event]) -> list[Event]:
    """The events as the proxy records them: each call's tokens stored once in the payload store, by digest."""
    out: list[Event] = []
    payloads: list[tuple[str, bytes]] = []
    for e in events:
        if isinstance(e, ModelCallRecorded):
            slim, raw = split_payload(e)
            out.append(slim)
            payloads.append((e.execution_id, raw))
        else:
            out.append(e)
    await log.payloads.put_many(payloads)
    return out
