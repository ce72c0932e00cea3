"""`opengyre train ...` as a user runs it: SFT warm start, then online RL from the log, then inspection."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.models import load_checkpoint
from opengyre.runtime import EmbeddedNats

from ._events import group

CLI = [sys.executable, "-m", "opengyre.cli"]


def og(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=240, env=full)


async def test_sft_then_rl_then_inspect(
    nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "golden.jsonl"
    convo = [{"role": "user", "content": "say hi"}, {"role": "assistant", "content": "hi"}]
    call = {"id": "c", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    tools = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]
    with_tools = [
        *convo[:1],
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c", "content": "a"},
    ]
    lines = [{"messages": convo}] * 2 + [{"messages": [*with_tools, convo[1]], "tools": tools}]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    sft = og("train", "sft", str(data), "--out", str(tmp_path / "sft"), "--epochs", "2", "--lr", "1e-3")
    assert sft.returncode == 0, sft.stderr
    assert "SFT on 3 trajectories" in sft.stdout
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"messages": [{"role": "robot", "content": "x"}]}) + "\n")
    refused = og("train", "sft", str(bad), "--out", str(tmp_path / "no"))
    assert refused.returncode == 2 and "golden-0" in refused.stdout and "role" in refused.stdout, refused.stdout
    assert not (tmp_path / "no").exists()
    _, version = load_checkpoint(tmp_path / "sft")
    assert version == "sft"

    await event_log.append_many(group("g", [("completed", 1.0, None), ("timed-out", 0.0, None)]))
    db = f"sqlite:///{tmp_path / 'db.sqlite'}"
    env = {"OPENGYRE_STREAM": log_config.stream, "OPENGYRE_SUBJECT_PREFIX": log_config.prefix}
    common = ["--data-dir", str(tmp_path), "--db-url", db]
    run = og(
        "train", "run", *common, "--nats-url", nats_server.url, "--steps", "1", "--group-size", "2",
        "--init-checkpoint", str(tmp_path / "sft"), "--algorithm", "grpo", "--lr", "1e-3", env=env,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "checkpoints" / "default" / "step-000001" / "model.safetensors").exists()
    steps = og("train", "steps", *common)
    assert steps.returncode == 0 and "default-s1" in steps.stdout, steps.stdout + steps.stderr
    preview = og("train", "preview", "g-e0", *common, "--max-paths", "2")
    assert preview.returncode == 0 and "2/4 paths" in preview.stdout, preview.stdout + preview.stderr
    missing = og("train", "preview", "nope", *common)
    assert missing.returncode != 0 and "no recorded calls" in missing.stdout
