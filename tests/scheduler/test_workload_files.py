"""Workloads as files: the shipped ones reproduce their published statistics, bad files are refused naming
the field, the unpublished knobs are derived from the published run, and a workload fitted from our own
stores (the scheduler's ledger, the proxy's trajectory store) runs in the simulator."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.eventlog import EventLog
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.projection import replay_into
from opengyre.proxy import TrajectoryProjection
from opengyre.scheduler import SchedulerProjection
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import (
    NL2REPO_122B,
    QWEN36_122B,
    ClusterConfig,
    CostConfig,
    EmpiricalDurations,
    GroupDurations,
    MoveCost,
    SimConfig,
    Simulator,
    WorkloadFileError,
    derive_knobs,
    dump_workload,
    feasible_lag,
    fit_workload,
    ideal_bound,
    load_workload,
    measure,
    read_store,
    setup,
    shipped_workload,
    simulate,
)
from opengyre.trajectory import split_payload

from ._small import small_config

runner = CliRunner()
GOOD = shipped_workload("nl2repo-122b")


def test_the_shipped_122b_file_is_the_calibrated_workload_and_round_trips(tmp_path: Path) -> None:
    assert GOOD.durations == NL2REPO_122B and GOOD.model == QWEN36_122B
    assert "timeout_h" in GOOD.assumed["workload"] and "active_params_b" in GOOD.assumed["model"]
    back = load_workload(dump_workload(GOOD, tmp_path / "w.toml"))
    assert (back.durations, back.model, back.run, back.gpu, back.published) == (
        GOOD.durations, GOOD.model, GOOD.run, GOOD.gpu, GOOD.published)  # fmt: skip


def test_the_2_4t_file_reproduces_its_one_published_statistic() -> None:
    big = shipped_workload("nl2repo-2.4t")
    s = measure(big.durations, groups=20_000, seed=5)
    assert abs(s.share_complete_queries_over - 0.611) < 0.015  # published: 61.1 % of complete queries over 4 h
    assert s.share_queries_timed_out > 0.05  # some queries do reach the assumed 6 h timeout
    assert big.model and big.model.active_params_b == 95 and big.run and big.run.hours == 75.42


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda t: t.replace("[run]", "[cluster]"), "unknown section(s) cluster"),
        (lambda t: t.replace("shape = 3.5068", "shape = 3.5068\nspread = 1"), "unknown field(s) spread"),
        (lambda t: t.replace("scale_h = 2.1529\n", ""), "scale_h is missing"),
        (lambda t: t.replace("hours = 16.12", 'hours = "sixteen"'), "hours must be float"),
        (lambda t: t.replace('kind = "weibull-lognormal"', 'kind = "gamma"'), "kind must be"),
        (lambda t: t.replace('assumed = ["timeout_h"]', 'assumed = ["colour"]'), "assumed names unknown"),
        (lambda t: t.replace("timeout_h = 6.0", "timeout_h = -1.0"), "timeout_h > 0"),
    ],
)
def test_a_bad_workload_file_is_refused_naming_the_field(tmp_path: Path, edit, message: str) -> None:  # type: ignore[no-untyped-def]
    text = (Path(__file__).parents[2] / "svc-scheduler/opengyre/scheduler/sim/workloads/nl2repo-122b.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(edit(text))
    with pytest.raises(WorkloadFileError, match=re.escape(message)):
        load_workload(bad)


def test_recorded_groups_longer_than_the_timeout_are_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the timeout"):
        EmpiricalDurations("x", ((100.0, 7200.0),), timeout_s=3600)


def test_the_derived_knobs_make_the_work_bound_the_published_time() -> None:
    assert GOOD.run and GOOD.model
    k = derive_knobs(GOOD.run, GOOD.model, GOOD.gpu, GOOD.durations)
    flops = 6 * 10e9 * 1e6 * 16  # active parameters x trained tokens x a group's executions
    assert k.micro_step_s == pytest.approx(flops / (32 * GOOD.gpu.flops * GOOD.gpu.mfu))
    cfg = setup(GOOD).config
    assert (cfg.cluster.slots_per_cell, cfg.costs.micro_step_s) == (k.slots_per_cell, k.micro_step_s)
    work = GroupDurations(cfg.workload, cfg.seed).groups(list(range(48 * 32)))
    bound = ideal_bound(cfg, work, max_staleness=None)
    # No GPU-time wasted at the published pace: the run's work spread over its GPUs is its published time.
    assert bound.work_h == pytest.approx(GOOD.run.hours, rel=0.02)
    lag = feasible_lag(cfg, GOOD.run.hours)
    assert ideal_bound(cfg, work, max_staleness=lag).chain_h <= GOOD.run.hours
    assert ideal_bound(cfg, work, max_staleness=lag - 1).chain_h > GOOD.run.hours


def test_the_default_config_is_the_derived_knobs_not_the_tuned_ones() -> None:
    assert GOOD.run and GOOD.model
    k = derive_knobs(GOOD.run, GOOD.model, GOOD.gpu, GOOD.durations)  # re-derived here, not a recorded number
    cfg = SimConfig()
    assert (cfg.cluster.slots_per_cell, cfg.costs.micro_step_s) == (k.slots_per_cell, k.micro_step_s)
    assert cfg.cluster.gpus_per_cell == k.gpus_per_cell == cfg.costs.reference_gpus
    assert (cfg.cluster.slots_per_cell, cfg.costs.micro_step_s) != (64, 600.0)
    # Another cell size gets the same GPUs per execution and the same GPU-work per micro-step.
    small = ClusterConfig(cells=2, nodes_per_cell=1, gpus_per_node=8)
    assert small.slots_per_cell == round(k.slots_per_cell * 8 / k.gpus_per_cell)
    assert CostConfig(reference_gpus=8).micro_step_s == pytest.approx(k.micro_step_s * k.gpus_per_cell / 8)
    assert ClusterConfig(slots_per_cell=7).slots_per_cell == 7 and CostConfig(micro_step_s=5.0).micro_step_s == 5.0


def test_the_tuned_knobs_live_in_their_own_named_file(tmp_path: Path) -> None:
    tuned = shipped_workload("nl2repo-122b-tuned")
    assert load_workload(dump_workload(tuned, tmp_path / "t.toml")).knobs == tuned.knobs  # round-trips
    # The same workload, model and run as the derived one: only the two knobs differ, set by hand.
    assert (tuned.durations, tuned.model, tuned.run, tuned.gpu, tuned.published, tuned.assumed) == (
        replace(GOOD.durations, name="nl2repo-122b-tuned"), GOOD.model, GOOD.run, GOOD.gpu, GOOD.published,
        GOOD.assumed)  # fmt: skip
    assert GOOD.knobs is None and tuned.knobs is not None and "tuned" in tuned.knobs.why
    built = setup(tuned)
    assert (built.config.cluster.slots_per_cell, built.config.costs.micro_step_s) == (64, 600.0)
    assert built.knobs is None and all(n.startswith("from the file") for n in built.notes)
    e2 = setup(tuned, cells=4, nodes_per_cell=8).config  # twice the GPUs per cell: twice the slots, half the time
    assert (e2.cluster.slots_per_cell, e2.costs.micro_step_s) == (128, 300.0)
    given = setup(tuned, slots_per_cell=10).config  # what is given wins over the file
    assert given.cluster.slots_per_cell == 10 and given.costs.micro_step_s == 600.0


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        (
            'slots_per_cell = 0\nmicro_step_s = 600.0\ngpus_per_cell = 32\nwhy = "x"\n',
            "slots_per_cell, gpus_per_cell >= 1",
        ),
        ("slots_per_cell = 64\nmicro_step_s = 600.0\ngpus_per_cell = 32\n", "why is missing"),
        (
            'slots_per_cell = 64\nmicro_step_s = 600.0\ngpus_per_cell = 32\nwhy = "x"\nassumed = ["why"]\n',
            "set by hand, not published",
        ),
    ],
)
def test_bad_fixed_knobs_are_refused(tmp_path: Path, knobs: str, message: str) -> None:
    text = (Path(__file__).parents[2] / "svc-scheduler/opengyre/scheduler/sim/workloads/nl2repo-122b.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text + "\n[knobs]\n" + knobs)
    with pytest.raises(WorkloadFileError, match=re.escape(message)):
        load_workload(bad)


def test_knobs_not_published_and_not_derivable_must_be_given() -> None:
    bare = replace(GOOD, run=None)
    with pytest.raises(ValueError, match="give --slots-per-cell and --micro-step-s"):
        setup(bare, cells=2, nodes_per_cell=1, gpus_per_node=8, steps=2, groups_per_step=2)
    cfg = setup(bare, cells=2, nodes_per_cell=1, gpus_per_node=8, steps=2, groups_per_step=2, slots_per_cell=16,
                micro_step_s=60).config  # fmt: skip
    assert cfg.cluster.slots_per_cell == 16 and cfg.costs.reference_gpus == 8


async def test_a_workload_fitted_from_our_stores_runs_in_the_simulator(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    # Free moves and slots for everything dispatched: a ledger time is the execution's duration plus, at most,
    # the seconds a cell takes to come back to rollout (the small workload's timeout is 3 h).
    cfg = small_config(record=True, steps=3)
    cfg = replace(cfg, cluster=replace(cfg.cluster, slots_per_cell=32), costs=replace(cfg.costs, move=MoveCost()))
    sim = Simulator(cfg, make_policy("elastic"))
    sim.run()
    calls = [  # two executions' calls in the trajectory store: a root and an extension of it
        ModelCallRecorded(execution_id=x, call_id="a", prompt_delta_ids=[1] * 90, output_ids=[2] * 10,
                          output_logprobs=[-0.5] * 10)
        for x in ("s1-g0-e0", "s1-g0-e1")
    ] + [
        ModelCallRecorded(execution_id="s1-g0-e0", call_id="b", parent_call_id="a", prefix_len=100,
                          prompt_delta_ids=[3] * 40, output_ids=[4] * 20, output_logprobs=[-0.5] * 20)
    ]  # fmt: skip
    # The gateway records its calls' tokens by payload: one execution's calls are stored so, and count the same.
    calls = [split_payload(c)[0] if c.execution_id == "s1-g0-e0" else c for c in calls]
    await event_log.append_many([*sim.events, *calls])
    await replay_into(SchedulerProjection(), event_log, engine)
    await replay_into(TrajectoryProjection(), event_log, engine)
    with engine.connect() as conn:
        with pytest.raises(ValueError, match="give --timeout-h at least that long"):
            read_store(conn)  # the recorded 3 h: some waited seconds for a slot
        sample = read_store(conn, timeout_h=3.01)
    # The groups are the ledger's, dispatch to finish, exactly as the events say.
    at = {}
    for e in sim.events:
        if isinstance(e, ExecutionDispatched | ExecutionFinished):
            at.setdefault(e.execution_id, []).append(e.occurred_at.timestamp())
    want = sorted(sorted(at[f"s{s}-g{g}-e{k}"][1] - at[f"s{s}-g{g}-e{k}"][0] for k in range(4))
                  for s in range(1, 4) for g in range(4))  # fmt: skip
    assert np.allclose(sorted(sorted(g) for g in sample.groups_s), want, atol=1e-3)
    assert sample.context_tokens == pytest.approx((160 + 100) / 2)  # largest call of each execution
    wf = fit_workload(sample, name="ours", source="test", model_like=GOOD)
    back = load_workload(dump_workload(wf, tmp_path / "ours.toml"))
    assert back.model and back.model.context_tokens == pytest.approx(130) and back.model.params_b == 122
    recorded = {tuple(round(d, 6) for d in g) for g in sample.groups_s}
    drawn = back.durations.sample(np.random.default_rng(0), 200)
    assert {tuple(round(float(d), 6) for d in row) for row in drawn} <= recorded  # it resamples recorded groups
    cfg = replace(small_config(steps=2), workload=back.durations)
    r = simulate(cfg, make_policy("elastic"))
    assert r.trained.groups == 2 * 4 and r.trained.p90_query_h <= max(max(g) for g in sample.groups_s) / 3600
    # The CLI writes the same file.
    out = tmp_path / "cli.toml"
    res = runner.invoke(app, ["sim", "fit", "--db", str(engine.url), "--name", "ours", "--out", str(out),
                              "--model-like", "nl2repo-122b", "--timeout-h", "3.01"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "12 complete groups of 4" in res.output and load_workload(out).durations == back.durations
    res = runner.invoke(app, ["sim", "run", "--workload", str(out), "-p", "elastic"])
    assert res.exit_code == 2 and "no [run] section" in res.output  # nothing is made up
    res = runner.invoke(app, ["sim", "run", "--workload", str(out), "--steps", "2", "--groups-per-step", "2",
                              "--cells", "2", "--nodes-per-cell", "1", "--gpus-per-node", "8", "--slots-per-cell", "8",
                              "--micro-step-s", "60",
                              "-p", "elastic", "-p", "colocate"])  # fmt: skip
    assert res.exit_code == 0, res.output
