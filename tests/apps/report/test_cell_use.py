"""The cell-idle fraction (``RunSummary.cell_use``) of a log: folded from the simulator's recorded events it equals
the simulator's own GPU accounting (slots held, rollout idle, micro-steps running, training cells waiting, the
rest), share by share, on runs of several policies, loops and workloads; and a log that cannot show it says so.

With one micro-step per step (one group a step: the live CPU trainer, one process) busy and idle training cells
match too; with more, the simulator runs a step's micro-steps on several training cells at once, which the log
cannot show (no micro-step events), so only the training cells' total is compared."""

from __future__ import annotations

import pytest

from opengyre.events import CellRegistered, ExecutionDispatched
from opengyre.report import fold_events
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import ClusterConfig, CostConfig, EmpiricalDurations, MoveCost, SimConfig, Simulator

GROUPS = ((5.0, 6.0, 7.0, 8.0), (4.0, 6.0, 5.5, 9.0), (3.0, 3.5, 12.0, 4.0))


@pytest.mark.parametrize(
    ("policy", "max_lag", "cells", "slots", "groups", "seed"),
    [
        ("colocate", 0, 2, 2, 1, 0),
        ("elastic", 0, 2, 2, 1, 0),
        ("elastic", 1, 3, 4, 1, 1),
        ("elastic", 1, 3, 4, 2, 1),
        ("colocate", 1, 3, 2, 2, 2),
    ],
)
def test_the_fold_of_the_simulators_events_equals_its_own_accounting(
    policy: str, max_lag: int, cells: int, slots: int, groups: int, seed: int
) -> None:
    cfg = SimConfig(
        loop=LoopConfig(steps=4, groups_per_step=groups, group_size=4, max_lag=max_lag),
        cluster=ClusterConfig(cells=cells, nodes_per_cell=1, gpus_per_node=1, slots_per_cell=slots),
        costs=CostConfig(micro_step_s=5.0, reference_gpus=1, step_overhead_s=0.0, to_training_s=1.5, to_rollout_s=0.5,
                         move=MoveCost("free")),
        workload=EmpiricalDurations("small", GROUPS, 120.0),
        seed=seed,
        record_events=True,
    )  # fmt: skip
    sim = Simulator(cfg, make_policy(policy))
    result = sim.run()
    use = fold_events([(i + 1, e) for i, e in enumerate(sim.events)]).cell_use
    assert use is not None
    gpu_h = sum(result.totals.values())
    want = {k: v / gpu_h for k, v in result.totals.items()}
    got = {
        "rollout_busy": use.rollout_busy,
        "rollout_idle": use.rollout_idle,
        "training_busy": use.training_busy,
        "training_idle": use.training_idle,
        "other": use.switching + use.unassigned,
    }
    if groups > 1:  # several micro-steps a step run at once in the simulator: compare the training cells' total
        for split in (got, want):
            split["training"] = split.pop("training_busy") + split.pop("training_idle")
    assert got == pytest.approx(want, abs=1e-9)
    assert use.window_s == pytest.approx(result.hours * 3600)
    assert use.idle + use.busy + use.switching == pytest.approx(1.0)


def test_a_log_without_a_training_step_has_no_cell_use() -> None:
    events = [
        CellRegistered(cell_id="c0", capacity=2),
        ExecutionDispatched(execution_id="x", task_id="t", group_id="g", cell_id="c0"),
    ]
    summary = fold_events(list(enumerate(events, 1)))
    assert summary.cell_use is None
