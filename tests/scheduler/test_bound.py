"""The ideal bound is one bound, valid for every policy on the same trained work: on random small workloads and
clusters no policy finishes before it."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from opengyre.scheduler import LoopConfig, Policy
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import (
    ClusterConfig,
    CostConfig,
    DurationModel,
    GroupDurations,
    SimConfig,
    ideal_bound,
    simulate,
)


@st.composite
def configs(draw: st.DrawFn) -> SimConfig:
    cells = draw(st.integers(2, 4))
    resident = draw(st.integers(0, 1))
    gpus = draw(st.lists(st.sampled_from([4, 8, 16]), min_size=0, max_size=cells + resident))
    group_size = draw(st.integers(1, 4))
    return SimConfig(
        loop=LoopConfig(
            steps=draw(st.integers(1, 4)), groups_per_step=draw(st.integers(1, 4)), group_size=group_size,
            max_lag=draw(st.integers(0, 2)), micro_groups=draw(st.integers(1, 2)), micro_splits=draw(st.integers(1, 3)),
        ),
        cluster=ClusterConfig(
            cells=cells, nodes_per_cell=1, gpus_per_node=8, slots_per_cell=draw(st.integers(1, 8)),
            resident_cells=resident, cell_gpus=tuple(gpus),
        ),
        costs=CostConfig(
            micro_step_s=draw(st.floats(10, 900)), reference_gpus=8, step_overhead_s=draw(st.floats(0, 120)),
        ),
        workload=DurationModel(
            "random", scale_h=draw(st.floats(0.05, 2.0)), shape=draw(st.floats(0.6, 4.0)),
            sigma_task=draw(st.floats(0.0, 1.0)), timeout_s=draw(st.floats(0.5, 6.0)) * 3600, group_size=group_size,
        ),
        seed=draw(st.integers(0, 1000)),
    )  # fmt: skip


def _policies(cfg: SimConfig, split: int, cap: int) -> list[Policy]:
    k = 1 + split % (cfg.cluster.cells - 1)
    lag = cfg.loop.max_lag
    return [
        make_policy("elastic"),
        make_policy("colocate"),
        make_policy("colocate-resident"),
        make_policy("async", train_cells=k),
        make_policy("async-streaming", train_cells=k),
        make_policy("elastic-carry"),
        make_policy("elastic-carry", max_staleness=cap, extra_groups=cap * cfg.loop.groups_per_step // 2),
        make_policy("elastic-carry", drop_stale=1, max_staleness=lag, extra_groups=2),
    ]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), split=st.integers(0, 10), cap=st.integers(0, 3))
def test_the_bound_is_below_every_policys_time(cfg: SimConfig, split: int, cap: int) -> None:
    policies = _policies(cfg, split, cap)
    loop = cfg.loop
    # One bound for the comparison: the run's work (its first steps x G groups) at the loosest staleness allowed.
    most = max(s for p in policies if (s := p.staleness_bound(loop)) is not None)
    work = GroupDurations(cfg.workload, cfg.seed).groups(list(range(loop.steps * loop.groups_per_step)))
    shared = ideal_bound(cfg, work, max_staleness=most)
    for p in policies:
        r = simulate(cfg, p)
        assert r.bound.hours <= r.hours * (1 + 1e-9), (p, r.bound, r.hours)
        if not r.trained.leaves_work_untrained:
            assert shared.hours <= r.hours * (1 + 1e-9), (p, shared, r.hours)
