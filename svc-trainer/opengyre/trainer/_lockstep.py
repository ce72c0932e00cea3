"""Model-parallel runs (megatron TP/PP over torch.distributed): rank 0 leads, the other ranks follow.

Rank 0 does everything that is not model math: it reads the log, folds the projection, admits and samples,
packs micro-batches, writes checkpoints and events. It tells the other ranks what to do next over
``broadcast_object_list``; they build the same backend, run the same collective operations on the same
micro-batches (a step, a weight export for a checkpoint), and save their own optimizer shard beside it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ._config import TrainerConfig
from ._step import DataParallel
from .backends import Backend

__all__ = ["data_parallel_for", "follow", "hear", "optimizer_file", "rank_and_size", "tell"]


def rank_and_size() -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def tell(kind: str, arg: Any = None) -> None:
    """Rank 0: send the next instruction to every rank."""
    dist.broadcast_object_list([(kind, arg)], src=0)


def hear() -> tuple[str, Any]:
    """Another rank: wait for rank 0's next instruction."""
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    kind, arg = box[0]
    return str(kind), arg


def data_parallel_for(backend: Backend, config: TrainerConfig) -> DataParallel:
    """The replicas this rank's model copy belongs to: ``world / (tp * pp)`` of them (1 without a launch)."""
    rank, world = rank_and_size()
    replicas = world // (config.tp * config.pp)
    if replicas <= 1:
        return DataParallel()
    return DataParallel(*backend.data_parallel(rank, world, replicas))


def optimizer_file(rank: int) -> str:
    return "optimizer.pt" if rank == 0 else f"optimizer-rank{rank}.pt"


def follow(config: TrainerConfig) -> int:
    """The loop of a rank other than 0; returns the number of steps it took part in."""
    from ._loop import build_learner, make_backend, restore_rng, rng_state

    rank, _ = rank_and_size()
    kind, resume = hear()
    if kind != "start":
        raise RuntimeError(f"rank {rank}: expected start, got {kind}")
    backend = make_backend(config, Path(resume) if resume else None)
    learner = build_learner(config, backend, reference=None)
    if resume and (Path(resume) / optimizer_file(rank)).exists():
        state = torch.load(Path(resume) / optimizer_file(rank), weights_only=True)
        learner.optimizer.load_state_dict(state["optimizer"])
        restore_rng(state.get("rng"))
    steps = 0
    while True:
        kind, arg = hear()
        if kind == "step":
            minibatches, epochs, lr = arg
            learner.set_lr(lr)
            learner.step(minibatches, epochs)
            steps += 1
        elif kind == "checkpoint":
            backend.hf_state_dict()  # the collective gather rank 0's export runs at the same time
            state = {"backend": backend.name, "optimizer": learner.optimizer.state_dict(), "rng": rng_state()}
            torch.save(state, Path(arg) / optimizer_file(rank))
        elif kind == "stop":
            return steps
        else:
            raise RuntimeError(f"rank {rank}: unknown instruction {kind}")
