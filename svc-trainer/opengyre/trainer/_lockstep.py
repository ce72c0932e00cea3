"""Model-parallel runs (megatron TP/PP over torch.distributed): rank 0 leads, the other ranks follow.

Rank 0 does everything that is not model math: it reads the log, folds the projection, admits and samples,
packs micro-batches, writes checkpoints and events. It tells the other ranks what to do next over
``broadcast_object_list``; they build the same backend, run the same collective operations on the same
micro-batches (a step, a weight export for a checkpoint), and save their own optimizer shard beside it.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ._config import TrainerConfig
from ._step import DataParallel
from .backends import Backend

__all__ = ["data_parallel_for", "hear", "optimizer_file", "rank_and_size", "tell"]


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
