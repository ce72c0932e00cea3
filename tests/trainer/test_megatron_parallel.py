"""Tensor parallelism over torch.distributed: megatron-core with TP=2 on CPU (gloo, two processes) gives the
torch backend's loss and gradients."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from opengyre.models import model_config
from opengyre.trainer import Learner
from opengyre.trainer.algorithms import GRPO
from opengyre.trainer.backends import TorchBackend

from .test_backends import batches


@pytest.mark.slow
def test_tensor_parallel_two_ranks_match_torch(tmp_path: Path) -> None:
    worker = Path(__file__).with_name("_tp_worker.py")
    store, out = tmp_path / "store", tmp_path / "out.pt"
    procs = [
        subprocess.Popen([sys.executable, str(worker), str(r), "2", str(store), str(out)], stderr=subprocess.PIPE)
        for r in range(2)
    ]
    errs = [p.communicate(timeout=240)[1].decode() for p in procs]
    assert all(p.returncode == 0 for p in procs), errs
    got = torch.load(out)
    ref = TorchBackend.from_config(model_config("tiny"), seed=3)
    learner = Learner(ref, GRPO())
    loss = sum(learner.accumulate(mb).loss for mb in batches())
    assert got["loss"] == pytest.approx(loss, rel=1e-5, abs=1e-7)
    want = ref.hf_grads()
    weights = ref.hf_state_dict()
    for k, g in got["grads"].items():
        torch.testing.assert_close(g, want[k], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(got["weights"][k], weights[k], rtol=0, atol=0)
