"""The RL loop the scheduler serves: read by the policies and the packing buffer alike (its own module so that
neither imports the other to reach it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["LoopConfig", "Packing"]

# How a training step picks its groups: "batch" = the groups dispatched for that step (the paper's loop);
# "fifo" = the first complete groups, whichever step they were dispatched for (partial-rollout carry-over).
Packing = Literal["batch", "fifo"]


@dataclass(frozen=True, slots=True)
class LoopConfig:
    """The RL loop the scheduler serves."""

    steps: int = 48
    groups_per_step: int = 32
    group_size: int = 16
    # phi: rollouts for step s may start once step s - 1 - max_lag is trained (0 = on-policy, synchronous).
    max_lag: int = 1
    micro_groups: int = 1  # groups per micro-step handed out by the packing buffer
    # Each micro-step's samples are cut into this many parts (gradient accumulation does not care), so the last
    # ones of a step spread over more cells and the cells finish together.
    micro_splits: int = 1

    @property
    def executions_per_step(self) -> int:
        return self.groups_per_step * self.group_size

    @property
    def microsteps_per_step(self) -> int:
        # the elastic policies turn their first cell once a whole step is ready (policies/_elastic.py)
        return -(-self.groups_per_step // self.micro_groups) * self.micro_splits

    def validate(self) -> None:
        smallest = min(self.steps, self.groups_per_step, self.group_size, self.micro_groups, self.micro_splits)
        if smallest < 1 or self.max_lag < 0:
            raise ValueError(f"invalid loop config: {self}")
