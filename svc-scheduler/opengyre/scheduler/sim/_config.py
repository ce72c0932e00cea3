"""What a simulation is: the cluster, the RL loop, the workload and the costs."""

from __future__ import annotations

from dataclasses import dataclass, field

from .._policy import LoopConfig
from ._costs import MoveCost
from ._facts import NL2REPO_122B, QWEN36_122B, nl2repo_122b_knobs
from ._workload import Durations

__all__ = ["ClusterConfig", "CostConfig", "SimConfig"]


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    cells: int = 8
    nodes_per_cell: int = 4
    gpus_per_node: int = 8
    # Executions one rollout cell holds at once. 0 (the default): derived from the 122B workload's published run
    # (``sim.derive_knobs``; 493 on its 32-GPU cells), at the same GPUs per execution on this cell's size.
    slots_per_cell: int = 0
    resident_cells: int = 0  # extra rollout-only cells (the optional resident pool), same size
    # GPUs of the first cells when they differ (a mixed cluster); the rest have nodes_per_cell x gpus_per_node.
    cell_gpus: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.slots_per_cell == 0:
            k = nl2repo_122b_knobs()
            object.__setattr__(
                self, "slots_per_cell", max(1, round(k.slots_per_cell * self.gpus_per_cell / k.gpus_per_cell))
            )

    @property
    def gpus_per_cell(self) -> int:
        return self.nodes_per_cell * self.gpus_per_node

    def gpus_of(self, i: int) -> int:
        return self.cell_gpus[i] if i < len(self.cell_gpus) else self.gpus_per_cell

    @property
    def total_gpus(self) -> int:
        return sum(self.gpus_of(i) for i in range(self.cells + self.resident_cells))

    @property
    def total_slots(self) -> int:
        return (self.cells + self.resident_cells) * self.slots_per_cell

    def validate(self) -> None:
        if min(self.cells, self.nodes_per_cell, self.gpus_per_node, self.slots_per_cell) < 1:
            raise ValueError(f"invalid cluster: {self}")
        if self.resident_cells < 0:
            raise ValueError("resident_cells must be >= 0")
        if len(self.cell_gpus) > self.cells + self.resident_cells or any(g < 1 for g in self.cell_gpus):
            raise ValueError(f"cell_gpus {self.cell_gpus} does not fit {self.cells + self.resident_cells} cells")


@dataclass(frozen=True, slots=True)
class CostConfig:
    # One micro-step (``LoopConfig.micro_groups`` groups, forward + backward) on ``reference_gpus`` GPUs; a cell
    # with g GPUs takes ``micro_step_s * reference_gpus / g`` (the same GPU-work however the GPUs are cut).
    # 0 (the default): derived from the 122B workload's published facts (``sim.derive_knobs``; 75.8 s on 32 GPUs).
    micro_step_s: float = 0.0
    reference_gpus: int = 32
    step_overhead_s: float = 60.0  # optimizer step and weight publication after the last micro-step
    to_training_s: float = 8.52  # QwenGyre's measured switch costs
    to_rollout_s: float = 3.46
    # A running execution moved off a cell that leaves rollout pays a re-prefill of its context on the new
    # engine (the proxy's default), a KV-cache migration, or nothing ("free").
    move: MoveCost = field(default_factory=lambda: MoveCost("re-prefill", QWEN36_122B))

    def __post_init__(self) -> None:
        if self.micro_step_s == 0.0:
            k = nl2repo_122b_knobs()
            object.__setattr__(self, "micro_step_s", k.micro_step_s * k.gpus_per_cell / max(self.reference_gpus, 1))

    def validate(self) -> None:
        if min(self.micro_step_s, self.reference_gpus) <= 0 or min(self.step_overhead_s, self.to_training_s,
                                                                   self.to_rollout_s) < 0:  # fmt: skip
            raise ValueError(f"invalid costs: {self}")
        self.move.validate()


@dataclass(frozen=True, slots=True)
class SimConfig:
    loop: LoopConfig = field(default_factory=LoopConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    costs: CostConfig = field(default_factory=CostConfig)
    workload: Durations = NL2REPO_122B
    seed: int = 0
    record_events: bool = False  # keep every event (for replay and the simulator-equals-live test)
    timeline_bins: int = 240
    # A policy that dispatches more than this many times the groups the run trains (plus the groups that fill
    # every slot once) is stopped as stalled:
    # it discards work faster than it trains (the simulator draws durations lazily, so nothing else stops it).
    max_dispatch_factor: float = 4.0

    def validate(self) -> None:
        self.loop.validate()
        self.cluster.validate()
        self.costs.validate()
        if self.workload.group_size != self.loop.group_size:
            raise ValueError("workload group size and loop group size differ")
