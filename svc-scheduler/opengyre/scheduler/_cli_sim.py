"""``opengyre sim run`` compares policies on a simulated cluster; ``opengyre sim calibrate`` fits a workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from .sim import PolicyRun, SimConfig

__all__ = ["sim_app"]

sim_app = typer.Typer(help="Discrete-event simulator: the real policies on a simulated clock.", no_args_is_help=True)
# The comparison table has thirteen columns: never narrower than 170 (a pipe or a test runner reports 80).
console = Console(width=max(Console().width, 170))

PolicyOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--policy", "-p",
        help="elastic, colocate, colocate-resident, async, async-streaming, elastic-carry, with name=value "
        "parameters (async:train_cells=3); async without train_cells runs at its best split; repeatable",
    ),
]  # fmt: skip


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
    move: Annotated[
        str,
        typer.Option(
            help="cost of moving a running execution off a cell leaving rollout: re-prefill (the "
            "proxy's default), kv-migration (the KVMigrator hook) or free"
        ),
    ] = "re-prefill",
    seed: Annotated[int, typer.Option()] = 0,
    plot: Annotated[Path | None, typer.Option(help="write the utilisation plot (PNG) here")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results as JSON here")] = None,
) -> None:
    """Simulate policies on the calibrated NL2RepoBench-122B workload and compare them at equal trained work."""
    from ._policy import LoopConfig
    from .policies import make_policy
    from .sim import (
        NL2REPO_122B,
        QWEN36_122B,
        ClusterConfig,
        CostConfig,
        MoveCost,
        SimConfig,
        SimulationStalled,
        plot_utilisation,
        run_spec,
    )
    from .sim._compare import parse_spec, summary
    from .sim._workload import DurationModel

    specs = policy or ["elastic", "colocate", "async", "async-streaming", "elastic-carry"]
    workload = NL2REPO_122B
    if group_size != workload.group_size:
        workload = DurationModel(workload.name, workload.scale_h, workload.shape, workload.sigma_task,
                                 workload.timeout_s, group_size)  # fmt: skip
    try:
        cfg = SimConfig(
            loop=LoopConfig(
                steps=steps, groups_per_step=groups_per_step, group_size=group_size, max_lag=max_lag,
                micro_splits=micro_splits,
            ),
            cluster=ClusterConfig(
                cells=cells, nodes_per_cell=nodes_per_cell, gpus_per_node=gpus_per_node, slots_per_cell=slots_per_cell,
                resident_cells=resident_cells, cell_gpus=tuple(int(g) for g in cell_gpus.split(",") if g.strip()),
            ),
            costs=CostConfig(
                micro_step_s=micro_step_s, step_overhead_s=step_overhead_s,
                move=MoveCost(move, QWEN36_122B),  # type: ignore[arg-type]  # validated below
            ),
            workload=workload,
            seed=seed,
        )  # fmt: skip
        cfg.validate()
        for spec in specs:  # unknown names and parameters fail before anything runs
            name, params = parse_spec(spec)
            make_policy(name, **params).validate(cfg.loop)
    except (KeyError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {exc}")
        raise typer.Exit(2) from exc
    runs = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("simulating", total=len(specs))
        for spec in specs:
            bar.update(task, description=f"simulating {spec}")
            try:
                runs.append(run_spec(cfg, spec))
            except SimulationStalled as exc:
                bar.stop()
                console.print(f"[bold red]error:[/] {exc}")
                console.print("A run that cannot finish has no time to compare: no ratios are printed.")
                raise typer.Exit(1) from exc
            bar.advance(task)
    _report(cfg, runs, workload.name)
    results = [r.result for r in runs]
    if plot is not None:
        plot_utilisation(results, plot, title=f"{workload.name}, {steps} steps")
        console.print(f"plot: {plot}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([summary(r) for r in runs], indent=2))
        console.print(f"json: {json_out}")


def _report(cfg: SimConfig, runs: list[PolicyRun], workload: str) -> None:
    from .sim import comparable

    base = next((r for r in runs if r.result.policy == "elastic"), runs[0])
    loop = cfg.loop
    table = Table(
        title=f"{loop.steps} steps x {loop.executions_per_step} executions, {cfg.cluster.total_gpus} GPUs, "
        f"phi={loop.max_lag}, workload {workload}, moves {cfg.costs.move.mode}; ratios against {base.label} at "
        "equal trained work"
    )
    table.add_column("policy", no_wrap=True, min_width=max(len(r.label) for r in runs))
    cols = ("hours", f"×{base.result.policy}", "trained", "lost GPU-h", ">4h", "p90 q h", "stale", "max",
            "×ideal", "moves", "move GPU-h", "switch", "sim s")  # fmt: skip
    for col in cols:
        table.add_column(col, justify="right")
    unequal: list[str] = []
    for run in runs:
        r, t = run.result, run.result.trained
        same = comparable(r, base.result)
        if not same:
            unequal.append(run.label)
        table.add_row(
            run.label, f"{r.hours:.2f}", f"{r.hours / base.result.hours:.3f}" if same else "n/a",
            f"{t.groups}/{t.dispatched_groups}", f"{t.lost_gpu_h:.0f}", f"{t.share_queries_over_4h:.1%}",
            f"{t.p90_query_h:.2f}", f"{r.staleness_mean:.3f}", str(r.staleness_max),
            f"{r.hours / r.bound.hours:.3f}", str(r.moves), f"{r.move_gpu_h:.0f}", str(r.switches),
            f"{run.wall_s:.2f}",
        )  # fmt: skip
    console.print(table)
    for label in unequal:
        run = next(r for r in runs if r.label == label)
        t = run.result.trained
        console.print(
            f"[yellow]{label}[/] trained other groups than {base.label} ({t.untrained_finished_groups} finished "
            f"and {t.untrained_unfinished_groups} unfinished groups never trained, {t.lost_gpu_h:.0f} GPU-h lost, "
            f"{t.share_queries_over_4h:.1%} of its trained queries over 4 h): its time is not comparable."
        )
    b = min((r.result.bound for r in runs if comparable(r.result, base.result)), key=lambda b: b.hours)
    console.print(
        f"ideal bound (the same trained work, any policy with staleness <= {b.max_staleness}): GPU-work/GPUs "
        f"{b.work_h:.2f} h, longest chain {b.chain_h:.2f} h"
    )
    for run in runs:
        if run.searched:
            console.print(f"{run.result.policy}: best fixed split {run.split} training cells of {cfg.cluster.cells}"
                          f" (tried {', '.join(map(str, run.searched))})")  # fmt: skip


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
