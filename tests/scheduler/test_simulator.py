"""The simulator: the real policies and rules on a simulated clock, checked from the events it records."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opengyre.events import CellRoleChanged, TrainingStepCompleted
from opengyre.scheduler import SchedulerState
from opengyre.scheduler.policies import POLICIES, make_policy
from opengyre.scheduler.sim import Simulator, simulate

from ._small import small_config

PARAMS: dict[str, dict[str, int]] = {"async": {"train_cells": 1}, "async-streaming": {"train_cells": 1}}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_trains_every_step_and_never_breaks_the_watermark(name: str) -> None:
    sim = Simulator(small_config(record=True), make_policy(name, **PARAMS.get(name, {})))
    result = sim.run()
    assert [s.step for s in result.steps] == list(range(1, 7))
    assert not result.refusals
    # Refold what the simulator recorded: the same state, and the rule held at every drain.
    replay = SchedulerState()
    for seq, e in enumerate(sim.events, 1):
        if isinstance(e, CellRoleChanged) and e.to_role == "draining":
            cap = replay.cells[e.cell_id].capacity
            assert replay.watermark <= replay.rollout_capacity - cap, (name, seq)
        replay.apply(e, seq)
    assert replay.snapshot() == sim.state.snapshot()
    assert result.hours >= result.bound.work_h * 0.999  # nothing beats spreading all work over all GPUs
    trained = [x for e in sim.events if isinstance(e, TrainingStepCompleted) for x in e.execution_ids]
    assert len(trained) == len(set(trained)) == 6 * 16  # every sample trained exactly once


def test_same_seed_same_run_different_seed_different_run() -> None:
    a = simulate(small_config(seed=5), make_policy("elastic")).summary()
    b = simulate(small_config(seed=5), make_policy("elastic")).summary()
    c = simulate(small_config(seed=6), make_policy("elastic")).summary()
    assert a == b
    assert a["hours"] != c["hours"]


@pytest.mark.parametrize("lag", [0, 1, 2])
def test_batch_policies_keep_staleness_within_the_bound(lag: int) -> None:
    for name in ("elastic", "colocate", "async"):
        r = simulate(small_config(lag=lag), make_policy(name, **PARAMS.get(name, {})))
        assert r.staleness_max <= lag, name
        assert r.hours >= r.bound.hours * 0.999, name  # the ideal bound is a bound


def test_colocate_switches_the_pool_only_when_nothing_is_live() -> None:
    sim = Simulator(small_config(record=True), make_policy("colocate"))
    sim.run()
    s = SchedulerState()
    drains = 0
    for seq, e in enumerate(sim.events, 1):
        if isinstance(e, CellRoleChanged) and e.to_role == "draining":
            assert s.watermark == 0
            drains += 1
        s.apply(e, seq)
    assert drains >= 4  # the whole pool went to training at least once


def test_async_keeps_a_fixed_split() -> None:
    sim = Simulator(small_config(record=True), make_policy("async", train_cells=2))
    sim.run()
    moved = {e.cell_id for e in sim.events if isinstance(e, CellRoleChanged) and e.from_role == "rollout"}
    back = [e for e in sim.events if isinstance(e, CellRoleChanged) and e.to_role == "rollout"]
    assert moved == {"cell0", "cell1"} and not back


def test_elastic_turns_cells_one_by_one_as_a_growing_prefix() -> None:
    sim = Simulator(small_config(record=True), make_policy("elastic"))
    sim.run()
    s = SchedulerState()
    for seq, e in enumerate(sim.events, 1):
        s.apply(e, seq)
        if isinstance(e, CellRoleChanged):
            heading = [c for c in s.cells.values() if c.role == "draining" or (
                c.role == "switching" and c.switch_from == "draining")]  # fmt: skip
            assert len(heading) <= 1
            away = sorted(c.order for c in s.cells.values() if c.role != "rollout")
            assert away == list(range(len(away)))  # cells away from rollout are always a prefix


def test_resident_pool_never_trains() -> None:
    sim = Simulator(small_config(record=True, resident=1), make_policy("elastic"))
    sim.run()
    assert not [e for e in sim.events if isinstance(e, CellRoleChanged) and e.cell_id == "pool4"]


def test_carry_over_trains_stragglers_in_a_later_step() -> None:
    sim = Simulator(small_config(record=True, lag=2), make_policy("elastic-carry"))
    sim.run()
    mixed = 0
    for e in sim.events:
        if isinstance(e, TrainingStepCompleted):
            batches = {int(x.split("-")[0][1:]) for x in e.execution_ids}
            mixed += batches != {e.step}
    assert mixed > 0


def test_carry_over_with_a_staleness_cap_never_trains_staler_samples() -> None:
    for extra in (2, 4):
        sim = Simulator(small_config(record=True, lag=0, steps=8), make_policy("elastic-carry", extra_groups=extra,
                                                                             max_staleness=1))  # fmt: skip
        r = sim.run()
        assert r.staleness_max <= 1
        trained = [x for e in sim.events if isinstance(e, TrainingStepCompleted) for x in e.execution_ids]
        assert len(trained) == len(set(trained)) == 8 * 16


def test_faster_cells_take_more_micro_steps() -> None:
    cfg = small_config(steps=4)
    cfg = replace(cfg, cluster=replace(cfg.cluster, cell_gpus=(16, 8, 8, 8)))
    r = simulate(cfg, make_policy("async", train_cells=2))  # cell0 (16 GPUs) and cell1 (8 GPUs) train
    done = r.microsteps_by_cell
    assert set(done) == {"cell0", "cell1"} and sum(done.values()) == 4 * 4
    assert done["cell0"] > 1.5 * done["cell1"]  # twice the GPUs, about twice the micro-steps


def test_colocate_with_a_resident_pool_leaves_the_tail_to_the_residents() -> None:
    sim = Simulator(small_config(record=True, resident=1), make_policy("colocate-resident"))
    sim.run()
    s = SchedulerState()
    early = 0
    for seq, e in enumerate(sim.events, 1):
        if isinstance(e, CellRoleChanged) and e.to_role == "draining":
            pool = sum(c.capacity for c in s.cells.values() if not c.resident and c.role == "rollout")
            assert s.watermark <= s.rollout_capacity - pool  # the whole pool's watermark rule
            early += s.watermark > 0
        s.apply(e, seq)
    assert early > 0  # at least once the pool left while the residents still ran executions


def test_split_micro_steps_train_every_sample_once() -> None:
    cfg = small_config(record=True)
    cfg = replace(cfg, loop=replace(cfg.loop, micro_splits=4))
    sim = Simulator(cfg, make_policy("elastic"))
    r = sim.run()
    assert sum(r.microsteps_by_cell.values()) == 6 * 4 * 4
    trained = [x for e in sim.events if isinstance(e, TrainingStepCompleted) for x in e.execution_ids]
    assert len(trained) == len(set(trained)) == 6 * 16
