"""Moving a running execution off a cell that leaves rollout costs what re-prefilling its context (or migrating
its KV cache) costs, charged as slot-time; a move never restarts the execution."""

from __future__ import annotations

from dataclasses import replace

import pytest

from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import QWEN36_122B, GpuFacts, GroupDurations, ModelFacts, MoveCost, SimConfig, simulate

from ._small import small_config

MODEL = ModelFacts("m", params_b=100, active_params_b=10, attention_layers=12, attention_width=8192,
                   kv_bytes_per_token=24576, context_tokens=1e6, trained_tokens=1e6)  # fmt: skip
GPU = GpuFacts(flops=1e15, mfu=0.5, link_bytes_per_s=50e9, link_latency_s=0.5)


def test_the_cost_grows_with_the_context_moved() -> None:
    reprefill, kv = MoveCost("re-prefill", MODEL, GPU), MoveCost("kv-migration", MODEL, GPU)
    n = 0.5 * 1e6  # half-way through: half the final context
    flops = 2 * 10e9 * n + 2 * 12 * 8192 * n * n
    assert reprefill.seconds(0.5, gpus_per_slot=0.5) == pytest.approx(flops / (1e15 * 0.5) / 0.5)
    assert kv.seconds(0.5, gpus_per_slot=0.5) == pytest.approx(0.5 + n * 24576 / 50e9)
    assert reprefill.seconds(0.25, 0.5) < reprefill.seconds(0.5, 0.5) / 2  # attention is quadratic
    assert MoveCost().seconds(0.5, 0.5) == 0
    with pytest.raises(ValueError, match="needs the model's facts"):
        MoveCost("re-prefill").validate()


def _rollout_gpu_h(cfg: SimConfig) -> float:
    """GPU-hours the run's executions hold slots for, without moves (every dispatched group is trained)."""
    n = cfg.loop.steps * cfg.loop.groups_per_step
    d = GroupDurations(cfg.workload, cfg.seed).groups(list(range(n)))
    per_slot = cfg.cluster.gpus_per_cell / cfg.cluster.slots_per_cell
    return float(d.sum()) * per_slot / 3600


@pytest.mark.parametrize("name", ["elastic", "colocate-resident"])
def test_moves_are_charged_as_slot_time_and_never_restart_an_execution(name: str) -> None:
    base = small_config(steps=6, resident=1 if name == "colocate-resident" else 0)
    runs = {
        mode: simulate(replace(base, costs=replace(base.costs, move=MoveCost(mode, QWEN36_122B))), make_policy(name))
        for mode in ("free", "kv-migration", "re-prefill")
    }
    held = _rollout_gpu_h(base)
    free, kv, prefill = runs["free"], runs["kv-migration"], runs["re-prefill"]
    assert free.moves > 0 and prefill.moves > 0
    # The utilisation timeline (slots held, cell by cell) equals the executions' durations plus what moves added.
    assert free.move_gpu_h == 0 and free.totals["rollout_busy"] == pytest.approx(held)
    assert prefill.totals["rollout_busy"] == pytest.approx(held + prefill.move_gpu_h)
    assert kv.totals["rollout_busy"] == pytest.approx(held + kv.move_gpu_h)
    assert prefill.move_gpu_h > 100 * kv.move_gpu_h > 0
    assert prefill.hours > free.hours
