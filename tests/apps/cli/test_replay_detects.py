"""The negative control of `opengyre replay`: one row of the live store changed or deleted after the run, and
replay says which projection and table differ and exits non-zero (a replay that cannot fail proves nothing)."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.eventlog import EventLog, LogConfig
from opengyre.runtime import EmbeddedNats

from ..._burst import scripted_burst


async def _append_burst(url: str, config: LogConfig) -> None:
    log = await EventLog.connect(url, config)
    try:
        await log.append_many(scripted_burst(5, "r"))
    finally:
        await log.close()


CORRUPTIONS = {
    "one column": "UPDATE synth_tasks SET hardened_count = hardened_count + 1 WHERE task_id = 'r-task1'",
    "one row gone": "DELETE FROM synth_tasks WHERE task_id = 'r-task1'",
}


@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_replay_reports_a_corrupted_row(corruption: str, nats_server: EmbeddedNats, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex[:10]
    config = LogConfig(stream=f"T{tag}", prefix=f"t{tag}.ev")
    asyncio.run(_append_burst(nats_server.url, config))
    env = {"OPENGYRE_STREAM": config.stream, "OPENGYRE_SUBJECT_PREFIX": config.prefix, "COLUMNS": "250"}
    common = ["--data-dir", str(tmp_path), "--nats-url", nats_server.url]
    cli = CliRunner()
    built = cli.invoke(app, ["projections", "rebuild", "tasks", *common], env=env)
    assert built.exit_code == 0, built.output

    clean = cli.invoke(app, ["replay", "-p", "tasks", *common], env=env)
    assert clean.exit_code == 0, clean.output
    assert "matches the live projection" in clean.output  # the control: the untouched store matches

    store = create_engine(f"sqlite:///{tmp_path / 'db' / 'synth.db'}")
    try:
        with store.begin() as conn:
            assert conn.execute(text(CORRUPTIONS[corruption])).rowcount == 1
    finally:
        store.dispose()

    res = cli.invoke(app, ["replay", "-p", "tasks", *common], env=env)
    assert res.exit_code == 1, res.output
    assert "the replay differs from the live projection tasks" in res.output
    (line,) = [x.strip() for x in res.output.splitlines() if "only in the replay" in x]
    assert line.startswith("synth_tasks: ")  # the one table touched, none of the others
    assert "'r-task1'" in line and "1 only in the replay" in line
    assert ("1 row(s) only live" in line) == (corruption == "one column")
