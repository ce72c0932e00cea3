"""One rank of a model-parallel megatron run on CPU (gloo): loss, gathered gradients, the global gradient norm,
and the weights after one optimizer step, on the test batches.

Usage: python _parallel_worker.py RANK WORLD TP PP STORE_FILE OUT_FILE (launched by test_megatron_parallel.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for ``tests.trainer``


def main() -> None:
    rank, world, tp, pp = (int(x) for x in sys.argv[1:5])
    store, out = sys.argv[5], sys.argv[6]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from opengyre.models import model_config
    from opengyre.trainer import Learner
    from opengyre.trainer.algorithms import GRPO
    from opengyre.trainer.backends import MegatronBackend, TorchBackend
    from tests.trainer.test_backends import batches

    cfg = model_config("tiny")
    init = TorchBackend.from_config(cfg, seed=3).hf_state_dict()
    backend = MegatronBackend(cfg, init, tp=tp, pp=pp)
    learner = Learner(backend, GRPO(), lr=1e-2, max_grad_norm=0.05)
    loss = sum(learner.accumulate(mb).loss for mb in batches())
    grads = backend.hf_grads()  # gathered over the model-parallel groups
    norm = learner.grad_norm()
    learner.apply()  # clipped by the global norm
    weights = backend.hf_state_dict()
    if rank == 0:
        torch.save({"loss": loss, "grads": grads, "norm": norm, "weights": weights}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
