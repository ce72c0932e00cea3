"""A run that cannot finish ends with an error naming why, never a ratio; no policy runs out of workload."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import pytest
from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.events import ExecutionDispatched, TrainingStepCompleted
from opengyre.scheduler import DispatchRequest, View
from opengyre.scheduler.policies import ElasticPolicy, make_policy
from opengyre.scheduler.sim import SimulationStalled, Simulator, simulate

from ._small import small_config

runner = CliRunner()


def test_a_run_with_no_training_cell_stops_with_the_reason() -> None:
    cfg = small_config(steps=3)
    cfg = replace(cfg, cluster=replace(cfg.cluster, cells=1))
    with pytest.raises(SimulationStalled) as err:
        simulate(cfg, make_policy("async", train_cells=1))  # one cell: the split keeps it rolling out
    e = err.value
    assert e.step == 0 and e.steps == 3
    assert "no cell is in training" in e.reason and "complete groups not trained" in e.reason


@dataclass
class _Discarding(ElasticPolicy):
    """A policy that keeps starting new groups labelled for steps it never trains (a runaway dispatcher)."""

    name: ClassVar[str] = "discarding"

    def dispatch(self, view: View) -> tuple[DispatchRequest, ...]:
        return (DispatchRequest(view.state.dispatched_step + 1, view.loop.groups_per_step),)


def test_a_policy_that_only_discards_work_is_stopped_not_run_forever() -> None:
    cfg = replace(small_config(steps=3), max_dispatch_factor=2.0)
    with pytest.raises(SimulationStalled) as err:
        simulate(cfg, _Discarding())
    assert "discards work faster than it trains" in err.value.reason


def test_carry_over_on_many_cells_trains_exactly_what_it_dispatched() -> None:
    # 64 cells x 8 slots hold 32 batches at once: the old default kept that many groups live and ran out of its
    # fixed pool of 3 x steps x G groups (stalled); now the run dispatches exactly the groups it trains.
    cfg = small_config(record=True, steps=6)
    cfg = replace(cfg, cluster=replace(cfg.cluster, cells=64))
    sim = Simulator(cfg, make_policy("elastic-carry"))
    sim.run()
    dispatched = {e.group_id for e in sim.events if isinstance(e, ExecutionDispatched)}
    trained = [x for e in sim.events if isinstance(e, TrainingStepCompleted) for x in e.execution_ids]
    assert len(trained) == len(set(trained)) == 6 * 4 * 4
    assert {x.rsplit("-", 1)[0] for x in trained} == dispatched and len(dispatched) == 6 * 4


def test_the_cli_prints_an_error_and_no_ratio_for_a_stalled_run() -> None:
    r = runner.invoke(app, ["sim", "run", "--steps", "2", "--groups-per-step", "2", "--cells", "1",
                            "--nodes-per-cell", "1", "--slots-per-cell", "16", "-p", "elastic", "-p",
                            "async:train_cells=1"])  # fmt: skip
    assert r.exit_code == 1, r.output
    assert "async stalled at step 0 of 2" in r.output and "no cell is in training" in r.output
    assert "×" not in r.output and "ratio" in r.output  # "no ratios are printed"


def test_elastic_turns_a_cell_when_a_whole_step_is_ready_even_below_ready_per_cell() -> None:
    # Recorded trace 47: ready_per_cell=2, but a step of 2 groups packed 2 per micro-step is one micro-step, so
    # the buffer can never hold 2 and no cell ever turned to training (stalled at step 0, which the recorded
    # traces held as the expected answer). A step's whole batch ready is enough.
    cfg = small_config(steps=2)
    cfg = replace(cfg, loop=replace(cfg.loop, groups_per_step=2, max_lag=0, micro_groups=2, micro_splits=1))
    cfg = replace(cfg, cluster=replace(cfg.cluster, cells=2))
    assert cfg.loop.microsteps_per_step == 1
    for name in ("elastic", "elastic-carry"):
        result = simulate(cfg, make_policy(name, ready_per_cell=2))
        assert [s.step for s in result.steps] == [1, 2], name
