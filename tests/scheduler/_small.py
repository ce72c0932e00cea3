"""A small simulated cluster for tests: seconds of CPU, every mechanism exercised."""

from __future__ import annotations

from opengyre.scheduler import LoopConfig
from opengyre.scheduler.sim import ClusterConfig, CostConfig, DurationModel, SimConfig

SMALL_WORKLOAD = DurationModel("small", scale_h=1.0, shape=2.0, sigma_task=0.3, timeout_s=3 * 3600, group_size=4)


def small_config(*, lag: int = 1, steps: int = 6, record: bool = False, seed: int = 3, resident: int = 0) -> SimConfig:
    return SimConfig(
        loop=LoopConfig(steps=steps, groups_per_step=4, group_size=4, max_lag=lag),
        cluster=ClusterConfig(cells=4, nodes_per_cell=1, gpus_per_node=8, slots_per_cell=8, resident_cells=resident),
        costs=CostConfig(micro_step_s=300.0, step_overhead_s=30.0),
        workload=SMALL_WORKLOAD,
        seed=seed,
        record_events=record,
    )
