"""Poison messages a producer's bug or a damaged store can leave in the log: each is a dead letter with its
reason, on every store alike, and the events behind it apply."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from sqlalchemy import Engine, func, select

from opengyre.eventlog import EventLog
from opengyre.events import Event, InvalidEvent, SkillIngested
from opengyre.projection import ProjectionRunner
from opengyre.runtime import load_service
from opengyre.store import DeadLetter, Tracking


async def _run_until_caught_up(runner: ProjectionRunner) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(runner.run(stop))
    try:
        await runner.wait_caught_up(60)
    finally:
        stop.set()
        await task


async def _publish_raw(log: EventLog, event: Event, body: bytes, **headers: str) -> None:
    """A message as a producer that skips our checks would write it."""
    subject = log.config.subject(event.aggregate, event.aggregate_id())
    hdrs = {"Og-Type": event.type_name(), "Nats-Msg-Id": event.event_id, **headers}
    ack = await log.js.publish(subject, body, headers=hdrs)
    assert ack.seq > 0


def _dead(engine: Engine) -> list[tuple[int, str]]:
    with engine.connect() as c:
        return [(int(r[0]), str(r[1])) for r in c.execute(select(DeadLetter.stream_seq, DeadLetter.reason))]


def _skill(i: int, description: str = "d") -> SkillIngested:
    return SkillIngested(skill_id=f"s{i}", name=f"skill-{i}", description=description)


async def test_a_nul_character_is_a_dead_letter_on_every_store_and_is_refused_at_append(
    event_log: EventLog, any_engine: Engine
) -> None:
    """Before: SQLite applied the NUL and PostgreSQL dead-lettered it, so a replay differed between them."""
    tasks = load_service("synth").projections()[0]
    bad = _skill(1, "before\x00after")
    with pytest.raises(InvalidEvent, match=r"\.description holds a NUL"):
        await event_log.append(bad)
    with pytest.raises(InvalidEvent):
        await event_log.append_many([_skill(0), bad])
    assert await event_log.last_seq() == 0  # the producer's error appended nothing of that call
    await event_log.append(_skill(0))
    await _publish_raw(event_log, bad, msgspec.json.encode(bad))
    await event_log.append_many([_skill(i) for i in range(2, 6)])
    runner = ProjectionRunner(tasks, event_log, any_engine)
    await _run_until_caught_up(runner)
    assert _dead(any_engine) == [(2, "nul-character")]
    skills = tasks.tables[1]
    with any_engine.connect() as c:
        names = sorted(c.execute(select(skills.c.skill_id)).scalars())
        tracked = c.execute(select(func.count()).select_from(Tracking)).scalar()
    assert names == ["s0", "s2", "s3", "s4", "s5"]  # acknowledged 6, applied 5, dead 1
    assert tracked == 6
