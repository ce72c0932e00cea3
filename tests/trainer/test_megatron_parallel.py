"""Model parallelism over torch.distributed: megatron-core with tensor parallelism (TP=2) or pipeline
parallelism (PP=2) on CPU (gloo, two processes) gives the torch backend's loss, gradients, global gradient
norm, and weights after a clipped optimizer step."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine

from opengyre.eventlog import EventLog, LogConfig
from opengyre.models import load_checkpoint, model_config
from opengyre.projection import replay_into
from opengyre.runtime import EmbeddedNats
from opengyre.trainer import Learner, OnlineTrainer, TrainerConfig, TrainerProjection, TrainerStore
from opengyre.trainer.algorithms import GRPO
from opengyre.trainer.backends import TorchBackend

from ._events import group
from .test_backends import batches


@pytest.mark.slow
@pytest.mark.parametrize(("tp", "pp"), [(2, 1), (1, 2)], ids=["tp2", "pp2"])
def test_two_ranks_match_torch(tmp_path: Path, tp: int, pp: int) -> None:
    worker = Path(__file__).with_name("_parallel_worker.py")
    store, out = tmp_path / "store", tmp_path / "out.pt"
    args = [str(tp * pp), str(tp), str(pp), str(store), str(out)]
    procs = [
        subprocess.Popen([sys.executable, str(worker), str(r), *args], stderr=subprocess.PIPE) for r in range(tp * pp)
    ]
    try:
        errs = [p.communicate(timeout=240)[1].decode()[-3000:] for p in procs]
    finally:
        for p in procs:  # one rank failing leaves the other waiting in a collective forever
            if p.poll() is None:
                p.kill()
                p.wait()
    assert all(p.returncode == 0 for p in procs), errs
    got = torch.load(out)

    ref = TorchBackend.from_config(model_config("tiny"), seed=3)
    learner = Learner(ref, GRPO(), lr=1e-2, max_grad_norm=0.05)
    loss = sum(learner.accumulate(mb).loss for mb in batches())
    want = ref.hf_grads()
    norm = learner.grad_norm()
    learner.apply()
    weights = ref.hf_state_dict()

    assert got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    assert got["norm"] == pytest.approx(norm, rel=1e-5) and norm > 0.05  # the clip is active
    assert set(got["grads"]) == {k for k in want if "rotary" not in k}
    for k, g in got["grads"].items():
        torch.testing.assert_close(g, want[k], rtol=1e-4, atol=1e-6)
        # Adam's first step moves a weight by ~lr * sign(grad): where a gradient is at float-noise level the two
        # runs may differ by a little; a real disagreement would be ~lr = 1e-2.
        torch.testing.assert_close(got["weights"][k], weights[k], rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "tp", "pp"),
    [("megatron", 2, 1), ("megatron", 1, 2), ("torch", 1, 1), ("megatron", 1, 1)],
    ids=["megatron-tp2", "megatron-pp2", "torch-dp2", "megatron-dp2"],
)
async def test_online_training_with_torchrun_matches_one_process(
    nats_server: EmbeddedNats,
    event_log: EventLog,
    log_config: LogConfig,
    engine: Engine,
    tmp_path: Path,
    backend: str,
    tp: int,
    pp: int,
) -> None:
    """`torchrun --nproc-per-node 2 -m opengyre.cli train run`: rank 0 leads (log, projection, checkpoint,
    events), rank 1 follows in lockstep, as the other half of a TP=2 or PP=2 model or as a second data-parallel
    replica; the published weights equal a one-process torch step's."""
    await event_log.append_many(group("g", [("completed", 1.0, None), ("timed-out", 0.25, None)]))
    before = await event_log.last_seq()
    env = {**os.environ, "OPENGYRE_STREAM": log_config.stream, "OPENGYRE_SUBJECT_PREFIX": log_config.prefix}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "opengyre.cli", "train", "run", "--data-dir", str(tmp_path), "--nats-url", nats_server.url,
        "--db-url", f"sqlite:///{tmp_path / 'lead.db'}", "--backend", backend, "--tp", str(tp), "--pp", str(pp),
        "--group-size", "2", "--algorithm", "grpo", "--lr", "1e-2", "--steps", "1", "--fold",
        "--micro-batch-tokens", "64",  # several micro-batches: data-parallel replicas both get some
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    published = tmp_path / "checkpoints" / "default" / "step-000001"
    assert (published / "optimizer.pt").exists() and (published / "optimizer-rank1.pt").exists()

    # The same step on one process with the torch backend, from the log as it was before the run.
    await replay_into(TrainerProjection(), event_log, engine, until_seq=before)
    cfg = TrainerConfig(group_size=2, algorithm="grpo", lr=1e-2, checkpoint_dir=tmp_path / "ref", micro_batch_tokens=64)
    report = await OnlineTrainer(cfg, TrainerStore(engine), None).step_once()
    assert report is not None and report.checkpoint is not None and report.completed.metrics["micro_steps"] >= 2
    got, _ = load_checkpoint(published)
    want, _ = load_checkpoint(report.checkpoint.path)
    w = want.state_dict()
    for k, v in got.state_dict().items():
        torch.testing.assert_close(v, w[k], rtol=1e-4, atol=1e-4)  # Adam's sign-sized first step: see above
