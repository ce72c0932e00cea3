"""Moving a running execution off a cell that leaves rollout costs what re-prefilling its context (or migrating
its KV cache) costs, charged as slot-time; a move never restarts the execution."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import tomli_w

from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import (
    QWEN36_122B,
    GpuFacts,
    GroupDurations,
    ModelFacts,
    MoveCost,
    SimConfig,
    WorkloadFileError,
    load_measured,
    setup,
    shipped_workload,
    simulate,
)

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


def _measurement(tmp_path: Path, **over: object) -> Path:
    fields: dict[str, object] = {
        "source": "a test", "model": "m", "gemm_flops": 1e11, "copy_bytes_per_s": 5e9, "prefill_efficiency": 0.25,
        "kv_link_efficiency": 0.1, "kv_latency_s": 0.02, **over,
    }  # fmt: skip
    doc = {"measured": {k: v for k, v in fields.items() if v is not None}}
    doc["measured"]["points"] = [{"tokens": 1024, "kv_cpu_s": 0.1}]  # the records are kept, not read
    path = tmp_path / "m.toml"
    path.write_text(tomli_w.dumps(doc))
    return path


def test_measured_move_costs_keep_the_measured_efficiencies_at_the_workloads_rates(tmp_path: Path) -> None:
    m = load_measured(_measurement(tmp_path))
    wf = shipped_workload("nl2repo-122b")
    base = setup(wf, move="re-prefill").config.costs.move
    got = {mode: setup(wf, move=mode, measured=m).config.costs.move for mode in ("re-prefill", "kv-migration")}
    g = got["re-prefill"].gpu
    assert (g.flops, g.mfu) == (wf.gpu.flops, 0.25)
    assert g.link_bytes_per_s == pytest.approx(wf.gpu.link_bytes_per_s * 0.1) and g.link_latency_s == 0.02
    # Re-prefill at 25 % of the GPU's peak instead of the assumed 40 %: 1.6 x the assumed cost, whatever the context.
    assert got["re-prefill"].seconds(0.5, 0.1) == pytest.approx(base.seconds(0.5, 0.1) * wf.gpu.mfu / 0.25)
    n = 0.5 * wf.model.context_tokens if wf.model else 0
    assert got["kv-migration"].seconds(0.5, 0.1) == pytest.approx(0.02 + n * 24576 / (50e9 * 0.1))
    # The knobs are derived with the workload's own GPU facts (training keeps its assumed MFU).
    assert setup(wf, measured=m).config.cluster == setup(wf).config.cluster


@pytest.mark.parametrize(
    ("over", "needle"),
    [
        ({"prefill_efficiency": 1.5}, "not in \\(0, 1\\]"),
        ({"kv_latency_s": None}, "missing \\['kv_latency_s'\\]"),
        ({"speedup": 2.0}, "unknown \\['speedup'\\]"),
        ({"gemm_flops": "fast"}, "gemm_flops must be float"),
    ],
)
def test_a_bad_measurement_file_is_refused(tmp_path: Path, over: dict[str, object], needle: str) -> None:
    with pytest.raises(WorkloadFileError, match=needle):
        load_measured(_measurement(tmp_path, **over))


def test_the_shipped_measurement_of_the_cpu_engine_loads() -> None:
    import opengyre.scheduler.sim as sim

    m = load_measured(Path(sim.__file__).parent / "measurements" / "cpu-engine.toml")
    assert m.model == "small" and 0 < m.prefill_efficiency <= 1 and 0 < m.kv_link_efficiency <= 1
