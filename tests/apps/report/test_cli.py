"""`opengyre report` on a run's log, on an empty log, on a stream that does not exist, and with no log at all."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import Event
from opengyre.runtime import EmbeddedNats

from ..._polling import wait_until
from ._run import scripted_run

CLI = [sys.executable, "-m", "opengyre.cli"]


def _config() -> LogConfig:
    tag = uuid.uuid4().hex[:10]
    return LogConfig(stream=f"T{tag}", prefix=f"t{tag}.ev", blob_bucket=f"B{tag}")


async def _write(url: str, config: LogConfig, events: list[Event]) -> None:
    log = await EventLog.connect(url, config)
    try:
        await log.append_many(events)
    finally:
        await log.close()


def _invoke(config: LogConfig, *args: str) -> tuple[int, str]:
    env = {"OPENGYRE_STREAM": config.stream, "OPENGYRE_SUBJECT_PREFIX": config.prefix, "COLUMNS": "250"}
    got = CliRunner().invoke(app, ["report", *args], env=env)
    return got.exit_code, got.output


def test_report_prints_the_tables_and_writes_the_html(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    config = _config()
    events = scripted_run(5)
    asyncio.run(_write(nats_server.url, config, events))
    out = tmp_path / "report.html"
    code, text = _invoke(config, "--nats-url", nats_server.url, "--data-dir", str(tmp_path), "--out", str(out))
    assert code == 0, text
    assert f"{len(events)} (seq 1..{len(events)})" in text and "reward per training step" in text
    assert "execution finished but never dispatched: 1" in text
    assert out.is_file() and 'id="plot-watermark"' in out.read_text()

    code, text = _invoke(config, "--nats-url", nats_server.url, "--data-dir", str(tmp_path), "--since-seq", "10", "--until-seq", "20")  # fmt: skip
    assert code == 0, text
    assert "11 (seq 10..20)" in text


def test_report_refuses_an_empty_log_a_missing_stream_and_no_log(nats_server: EmbeddedNats, tmp_path: Path) -> None:
    config = _config()
    asyncio.run(_write(nats_server.url, config, []))  # the stream exists, empty
    common = ["--nats-url", nats_server.url, "--data-dir", str(tmp_path)]
    code, text = _invoke(config, *common)
    assert code == 2 and f"the event log {config.stream!r} is empty" in text, text

    asyncio.run(_write(nats_server.url, config, scripted_run(6)[:3]))
    code, text = _invoke(config, *common, "--since-seq", "50")
    assert code == 2 and "ends at seq 3: nothing from seq 50 on" in text, text

    code, text = _invoke(_config(), *common)
    assert code == 2 and "no event stream" in text and "nothing has been logged there" in text, text

    code, text = _invoke(config, "--data-dir", str(tmp_path / "nowhere"))
    assert code == 2 and "no event log in" in text, text

    code, text = _invoke(config, *common, "--since-seq", "5", "--until-seq", "4")
    assert code == 2 and "--until-seq 4 is before --since-seq 5" in text, text


async def _consumers(url: str, config: LogConfig) -> int:
    log = await EventLog.connect(url, config, create=False)
    try:
        info = await log.js.stream_info(config.stream)
        return int(info.state.consumer_count)
    finally:
        await log.close()


def test_report_follow_shows_the_run_live_until_interrupted_then_reports_it_all(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    config = _config()
    events = scripted_run(7)
    half = len(events) // 2
    asyncio.run(_write(nats_server.url, config, events[:half]))
    out = tmp_path / "live.html"
    env = {"OPENGYRE_STREAM": config.stream, "OPENGYRE_SUBJECT_PREFIX": config.prefix}
    args = ["report", "--follow", "--nats-url", nats_server.url, "--data-dir", str(tmp_path), "--out", str(out)]
    proc = subprocess.Popen([*CLI, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "250", **env})  # fmt: skip
    try:
        # Its subscription is up (a consumer on the stream) once it listens for Ctrl-C.
        wait_until(lambda: asyncio.run(_consumers(nats_server.url, config)) >= 1, "report --follow subscribed")
        asyncio.run(_write(nats_server.url, config, events[half:]))
        proc.send_signal(signal.SIGINT)
        text, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, text
    assert "OpenGyre run" in text  # the dashboard
    assert f"{len(events)} (seq 1..{len(events)})" in text and "reward per training step" in text
    assert out.is_file() and 'id="plot-roles"' in out.read_text()


def test_the_cli_loads_without_matplotlib() -> None:
    """Every `opengyre` command imports the report's command; only writing an HTML report pays for matplotlib."""
    code = "import sys, opengyre.cli, opengyre.report; print('matplotlib' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False"
