"""A rank other than 0: it follows rank 0's instructions (its own module, above both the lockstep primitives
and the loop's builders, so that neither of those imports the other)."""

from __future__ import annotations

from pathlib import Path

import torch

from ._config import TrainerConfig
from ._lockstep import hear, optimizer_file, rank_and_size
from ._loop import build_learner, make_backend, restore_rng, rng_state

__all__ = ["follow"]


def follow(config: TrainerConfig) -> int:
    """The loop of a rank other than 0; returns the number of steps it took part in."""
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
