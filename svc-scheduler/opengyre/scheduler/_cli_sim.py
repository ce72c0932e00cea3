"""``opengyre sim run`` compares policies on a simulated cluster; ``opengyre sim calibrate`` fits a workload."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

__all__ = ["sim_app"]

sim_app = typer.Typer(help="Discrete-event simulator: the real policies on a simulated clock.", no_args_is_help=True)
# The comparison table has ten columns: never narrower than 120 (a pipe or a test runner reports 80).
console = Console(width=max(Console().width, 120))

PolicyOpt = Annotated[
    list[str] | None,
    typer.Option("--policy", "-p", help="elastic, colocate, async, async-streaming, elastic-carry; repeatable"),
]


def _params(spec: str) -> tuple[str, dict[str, int]]:
    """``async:train_cells=3`` -> ("async", {"train_cells": 3})."""
    name, _, rest = spec.partition(":")
    params: dict[str, int] = {}
    for kv in filter(None, rest.split(",")):
        k, _, v = kv.partition("=")
        params[k.strip()] = int(v)
    return name, params


@sim_app.command("run")
def run(
    policy: PolicyOpt = None,
    steps: Annotated[int, typer.Option(help="training steps")] = 48,
    groups_per_step: Annotated[int, typer.Option(help="groups (prompts) per step")] = 32,
    group_size: Annotated[int, typer.Option(help="executions per group")] = 16,
    max_lag: Annotated[int, typer.Option(help="staleness bound phi: steps rollouts may run ahead")] = 1,
    micro_splits: Annotated[int, typer.Option(help="parts each group's micro-step is cut into")] = 1,
    cells: Annotated[int, typer.Option(help="elastic cells")] = 8,
    nodes_per_cell: Annotated[int, typer.Option()] = 4,
    gpus_per_node: Annotated[int, typer.Option()] = 8,
    slots_per_cell: Annotated[int, typer.Option(help="executions a rollout cell holds")] = 64,
    resident_cells: Annotated[int, typer.Option(help="extra rollout-only cells")] = 0,
    cell_gpus: Annotated[str, typer.Option(help="GPUs of the first cells when they differ, e.g. 64,64,16")] = "",
    micro_step_s: Annotated[float, typer.Option(help="one micro-step on one cell, seconds")] = 600.0,
    step_overhead_s: Annotated[float, typer.Option(help="optimizer step + weight publish")] = 60.0,
    seed: Annotated[int, typer.Option()] = 0,
    plot: Annotated[Path | None, typer.Option(help="write the utilisation plot (PNG) here")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results as JSON here")] = None,
) -> None:
    """Simulate policies on the calibrated NL2RepoBench-122B workload and compare them."""
    from ._policy import LoopConfig
    from .policies import make_policy
    from .sim import NL2REPO_122B, ClusterConfig, CostConfig, SimConfig, plot_utilisation, simulate
    from .sim._workload import DurationModel

    specs = policy or ["elastic", "colocate", "async", "async-streaming", "elastic-carry"]
    workload = NL2REPO_122B
    if group_size != workload.group_size:
        workload = DurationModel(workload.name, workload.scale_h, workload.shape, workload.sigma_task,
                                 workload.timeout_s, group_size)  # fmt: skip
    cfg = SimConfig(
        loop=LoopConfig(
            steps=steps,
            groups_per_step=groups_per_step,
            group_size=group_size,
            max_lag=max_lag,
            micro_splits=micro_splits,
        ),
        cluster=ClusterConfig(
            cells,
            nodes_per_cell,
            gpus_per_node,
            slots_per_cell,
            resident_cells,
            tuple(int(g) for g in cell_gpus.split(",") if g.strip()),
        ),
        costs=CostConfig(micro_step_s=micro_step_s, step_overhead_s=step_overhead_s),
        workload=workload,
        seed=seed,
    )
    try:
        cfg.validate()
        policies = [make_policy(n, **p) for n, p in map(_params, specs)]
    except (KeyError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("simulating", total=len(policies))
        for p in policies:
            bar.update(task, description=f"simulating {p.name}")
            t0 = time.perf_counter()
            r = simulate(cfg, p)
            r.totals["wall_s"] = time.perf_counter() - t0
            results.append(r)
            bar.advance(task)
    base = next((r.hours for r in results if r.policy == "elastic"), results[0].hours)
    table = Table(title=f"{steps} steps x {groups_per_step * group_size} executions, {cfg.cluster.total_gpus} GPUs, "
                        f"phi={max_lag}, workload {workload.name}")  # fmt: skip
    table.add_column("policy", no_wrap=True, min_width=max(len(r.policy) for r in results))
    for col in ("hours", "×elastic", "busy", "stale", "max", "ideal h", "×ideal", "switch", "sim s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            r.policy if r.completed else f"{r.policy} [red](stalled at step {len(r.steps)})[/]", f"{r.hours:.2f}",
            f"{r.hours / base:.3f}", f"{r.utilisation:.1%}", f"{r.staleness_mean:.3f}",
            str(r.staleness_max), f"{r.bound.hours:.2f}", f"{r.hours / r.bound.hours:.3f}", str(r.switches),
            f"{r.totals['wall_s']:.2f}",
        )  # fmt: skip
    console.print(table)
    b = results[0].bound
    console.print(f"ideal bound: GPU-work/GPUs {b.work_h:.2f} h, longest chain {b.chain_h:.2f} h")
    if plot is not None:
        plot_utilisation(results, plot, title=f"{workload.name}, {steps} steps")
        console.print(f"plot: {plot}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([r.summary() for r in results], indent=2))
        console.print(f"json: {json_out}")


@sim_app.command("calibrate")
def calibrate_cmd(
    mean_execution_h: Annotated[float, typer.Option(help="published mean rollout (execution) time")] = 1.93,
    mean_query_h: Annotated[float, typer.Option(help="published mean query (group) time")] = 2.96,
    share_over: Annotated[float, typer.Option(help="published share of queries over --over-h")] = 0.0951,
    over_h: Annotated[float, typer.Option()] = 4.0,
    timeout_h: Annotated[float, typer.Option(help="execution timeout (not published: assumed)")] = 6.0,
    group_size: Annotated[int, typer.Option()] = 16,
) -> None:
    """Fit the duration model to published statistics (defaults: QwenGyre, NL2RepoBench on 122B)."""
    from .sim import calibrate

    c = calibrate(
        "fitted", mean_execution_h=mean_execution_h, mean_query_h=mean_query_h, share_queries_over=share_over,
        over_h=over_h, timeout_s=timeout_h * 3600, group_size=group_size,
    )  # fmt: skip
    table = Table(title="calibration")
    for col in ("statistic", "published", "fitted"):
        table.add_column(col)
    table.add_row("mean execution (h)", f"{c.target.mean_execution_h:.3f}", f"{c.fitted.mean_execution_h:.3f}")
    table.add_row("mean query (h)", f"{c.target.mean_query_h:.3f}", f"{c.fitted.mean_query_h:.3f}")
    table.add_row(
        f"queries over {over_h:g} h", f"{c.target.share_queries_over:.2%}", f"{c.fitted.share_queries_over:.2%}"
    )
    table.add_row("executions timed out", "-", f"{c.fitted.share_timed_out:.3%}")
    console.print(table)
    m = c.model
    console.print(f"model: scale {m.scale_h:.4f} h, Weibull shape {m.shape:.4f}, task sigma {m.sigma_task:.4f}, "
                  f"timeout {m.timeout_s / 3600:g} h")  # fmt: skip
