"""A trainer killed (SIGKILL) in the middle of a step, at each of the step's fault points, and restarted: the
step is trained once and its weights are published once, whichever point the crash hit."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import TrainingStepCompleted, WeightsPublished
from opengyre.models import checkpoint_info
from opengyre.runtime import EmbeddedNats
from opengyre.trainer._fault import FAULT_ENV, FAULT_POINTS

from ._events import group

WORKER = Path(__file__).with_name("_crash_worker.py")
# Where the crash leaves the step already recorded in the log: the restart must not train it again.
RECORDED = {"trainer.publish.after-completed", "trainer.publish.after-published"}


def files(folder: Path) -> dict[str, tuple[int, int]]:
    """Each file of a folder with its inode and mtime: a rewrite (a second training's checkpoint) changes them."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


async def serve(data: Path, nats: EmbeddedNats, cfg: LogConfig, fault: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    if fault is not None:
        env[FAULT_ENV] = fault
    argv = [sys.executable, str(WORKER), str(data), nats.url, cfg.stream, cfg.prefix, cfg.blob_bucket]
    done = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode not in (0, -signal.SIGKILL):
        raise AssertionError(f"worker exited {done.returncode}:\n{done.stderr[-4000:]}")
    return done.returncode


@pytest.mark.slow  # two service processes per point, a training step each
@pytest.mark.parametrize("point", FAULT_POINTS)
async def test_a_trainer_killed_mid_step_trains_the_step_once_and_publishes_it_once(
    point: str, nats_server: EmbeddedNats, event_log: EventLog, log_config: LogConfig, tmp_path: Path
) -> None:
    (tmp_path / "trainer.toml").write_text(
        'run_id = "crash"\nmodel = "tiny"\nalgorithm = "grpo"\ngroup_size = 2\nlr = 1e-3\ncheckpoint_dir = "ckpt"\n'
    )
    await event_log.append_many(group("g", [("completed", 1.0, None), ("completed", 0.0, None)]))
    assert await serve(tmp_path, nats_server, log_config, point) == -signal.SIGKILL  # it died at the point
    ckpt = tmp_path / "ckpt" / "crash" / "step-000001"
    before = files(ckpt) if ckpt.is_dir() else None
    assert await serve(tmp_path, nats_server, log_config, None) == 0  # the restart finished the step

    events = [event_log.decode(s) async for s in event_log.read(1)]
    steps = [e for e in events if isinstance(e, TrainingStepCompleted)]
    published = [e for e in events if isinstance(e, WeightsPublished)]
    assert [s.step for s in steps] == [1]  # trained once: no lost step, no second step on the same groups
    assert sorted([*steps[0].execution_ids, *steps[0].dropped]) == ["g-e0", "g-e1"]
    assert [(p.step, p.weight_version) for p in published] == [(1, steps[0].weight_version)]  # published once
    info = checkpoint_info(Path(published[0].uri))
    assert info is not None and info["sha256"] == published[0].digest  # what was announced is what is on disk
    if point in RECORDED:
        assert before is not None and files(ckpt) == before  # the restart did not train the recorded step again
