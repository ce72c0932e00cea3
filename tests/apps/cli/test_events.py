"""`events tail`, `events show`, `replay` and `projections rebuild` on a log holding a poison blob message."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.eventlog import BLOB_HEADER, EventLog, LogConfig
from opengyre.events import ExecutionFinished, SkillIngested
from opengyre.runtime import EmbeddedNats


async def _log_with_a_missing_blob(url: str, config: LogConfig) -> None:
    log = await EventLog.connect(url, config)
    try:
        await log.append(SkillIngested(skill_id="s1", name="one", description="d"))
        ghost = SkillIngested(skill_id="s2", name="two", description="d")
        headers = {"Og-Type": ghost.type_name(), "Nats-Msg-Id": ghost.event_id, BLOB_HEADER: f"event-{uuid.uuid4()}"}
        await log.js.publish(config.subject("skill", "s2"), b"", headers=headers)
        await log.append(SkillIngested(skill_id="s3", name="three", description="d"))
    finally:
        await log.close()


def test_the_cli_shows_a_message_whose_blob_is_missing_as_unreadable(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    """Before: `events tail`, `events show` and `replay` ended in ObjectNotFoundError tracebacks."""
    tag = uuid.uuid4().hex[:10]
    config = LogConfig(stream=f"T{tag}", prefix=f"t{tag}.ev")
    asyncio.run(_log_with_a_missing_blob(nats_server.url, config))
    env = {"OPENGYRE_STREAM": config.stream, "OPENGYRE_SUBJECT_PREFIX": config.prefix, "COLUMNS": "250"}
    common = ["--data-dir", str(tmp_path), "--nats-url", nats_server.url]
    cli = CliRunner()

    tail = cli.invoke(app, ["events", "tail", *common], env=env)
    assert tail.exit_code == 0, tail.output
    assert "unreadable: blob-missing" in tail.output and 'name="three"' in tail.output

    show = cli.invoke(app, ["events", "show", "2", *common], env=env)
    assert show.exit_code == 0, show.output
    assert "does not decode (blob-missing)" in show.output and "body unreadable" in show.output

    rebuilt = cli.invoke(app, ["projections", "rebuild", "tasks", *common], env=env)
    assert rebuilt.exit_code == 0, rebuilt.output
    assert "rebuilt tasks from 3 events" in rebuilt.output
    replay = cli.invoke(app, ["replay", "-p", "tasks", *common], env=env)
    assert replay.exit_code == 0, replay.output
    assert "replayed tasks to the end of the log: 3 events" in replay.output
    assert "matches the live projection" in replay.output
    listed = cli.invoke(app, ["projections", "list", *common], env=env)
    assert listed.exit_code == 0, listed.output
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in listed.output.splitlines() if "│" in line]
    tasks = next(r for r in rows if r[0] == "tasks")
    assert tasks[1:] == ["synth", "3", "3", "0", "3", "1", "folding"]  # owner, position, last, pending, tracked, dead


def test_events_show_says_which_sandbox_ran_an_execution(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    config = LogConfig(stream=f"T{tag}", prefix=f"t{tag}.ev")

    async def fill() -> None:
        log = await EventLog.connect(nats_server.url, config)
        try:
            for eid, sandbox in (("a", "none"), ("b", "namespace"), ("c", "")):
                await log.append(ExecutionFinished(execution_id=eid, status="completed", score=1.0, sandbox=sandbox))
        finally:
            await log.close()

    asyncio.run(fill())
    env = {"OPENGYRE_STREAM": config.stream, "OPENGYRE_SUBJECT_PREFIX": config.prefix, "COLUMNS": "250"}
    common = ["--data-dir", str(tmp_path), "--nats-url", nats_server.url]
    shown = [CliRunner().invoke(app, ["events", "show", str(seq), *common], env=env) for seq in (1, 2, 3)]
    assert all(s.exit_code == 0 for s in shown), [s.output for s in shown]
    assert "sandbox none (no isolation" in shown[0].output and '"sandbox": "none"' in shown[0].output
    assert "sandbox namespace\n" in shown[1].output
    assert "sandbox not recorded" in shown[2].output
