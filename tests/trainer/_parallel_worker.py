"""One rank of a tensor-parallel megatron run on CPU (gloo): loss and gathered gradients of the test batches.

Usage: python _tp_worker.py RANK WORLD STORE_FILE OUT_FILE (launched by test_megatron_tp.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root, for ``tests.trainer``


def main() -> None:
    rank, world, store, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    from opengyre.models import model_config
    from opengyre.trainer import Learner
    from opengyre.trainer.algorithms import GRPO
    from opengyre.trainer.backends import MegatronBackend, TorchBackend
    from tests.trainer.test_backends import batches

    cfg = model_config("tiny")
    init = TorchBackend.from_config(cfg, seed=3).hf_state_dict()
    backend = MegatronBackend(cfg, init, tp=world)
    learner = Learner(backend, GRPO())
    loss = sum(learner.accumulate(mb).loss for mb in batches())
    grads = backend.hf_grads()  # gathered over the tensor-parallel group
    weights = backend.hf_state_dict()
    if rank == 0:
        torch.save({"loss": loss, "grads": grads, "weights": weights}, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
