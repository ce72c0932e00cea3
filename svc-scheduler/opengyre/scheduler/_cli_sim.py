"""``opengyre sim run`` compares policies on a simulated cluster; ``opengyre sim calibrate`` fits a workload."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

if TYPE_CHECKING:
    from .sim import PolicyRun, SimConfig, WorkloadFile

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
    workload: Annotated[
        str,
        typer.Option(
            help="a shipped workload (nl2repo-122b, nl2repo-2.4t; nl2repo-122b-tuned: hand-picked knobs) "
            "or a workload file (.toml)"
        ),
    ] = "nl2repo-122b",
    steps: Annotated[int | None, typer.Option(help="training steps (default: the workload's run)")] = None,
    groups_per_step: Annotated[int | None, typer.Option(help="groups (prompts) per step")] = None,
    max_lag: Annotated[int, typer.Option(help="staleness bound phi: steps rollouts may run ahead")] = 1,
    micro_splits: Annotated[int, typer.Option(help="parts each group's micro-step is cut into")] = 1,
    cells: Annotated[int | None, typer.Option(help="elastic cells (default: the workload's run)")] = None,
    nodes_per_cell: Annotated[int | None, typer.Option()] = None,
    gpus_per_node: Annotated[int | None, typer.Option()] = None,
    slots_per_cell: Annotated[
        int | None, typer.Option(help="executions a rollout cell holds (default: derived from the published run)")
    ] = None,
    resident_cells: Annotated[int, typer.Option(help="extra rollout-only cells")] = 0,
    cell_gpus: Annotated[str, typer.Option(help="GPUs of the first cells when they differ, e.g. 64,64,16")] = "",
    micro_step_s: Annotated[
        float | None, typer.Option(help="one group's micro-step on one cell, seconds (default: derived)")
    ] = None,
    step_overhead_s: Annotated[float, typer.Option(help="optimizer step + weight publish")] = 60.0,
    move: Annotated[
        str,
        typer.Option(
            help="cost of moving a running execution off a cell leaving rollout: re-prefill (the "
            "proxy's default), kv-migration (the KVMigrator hook, the paper's RDMA) or free"
        ),
    ] = "re-prefill",
    measured: Annotated[
        Path | None,
        typer.Option(
            help="move costs at the efficiencies measured on the built engine (a file written by "
            "svc-scheduler/bench/move_costs.py --out; see docs/scheduler.md)"
        ),
    ] = None,
    seed: Annotated[int, typer.Option()] = 0,
    plot: Annotated[Path | None, typer.Option(help="write the utilisation plot (PNG) here")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the results as JSON here")] = None,
) -> None:
    """Simulate policies on a workload and compare them at equal trained work."""
    from .policies import make_policy
    from .sim import MOVE_MODES, SimulationStalled, load_measured, plot_utilisation, run_spec, setup
    from .sim._compare import parse_spec, summary

    specs = policy or ["elastic", "colocate", "async", "async-streaming", "elastic-carry"]
    try:
        wf = _workload(workload)
        if move not in MOVE_MODES:
            raise ValueError(f"--move {move!r}; known: {', '.join(MOVE_MODES)}")
        built = setup(
            wf, steps=steps, groups_per_step=groups_per_step, max_lag=max_lag, micro_splits=micro_splits,
            cells=cells, nodes_per_cell=nodes_per_cell, gpus_per_node=gpus_per_node, slots_per_cell=slots_per_cell,
            micro_step_s=micro_step_s, resident_cells=resident_cells, step_overhead_s=step_overhead_s,
            cell_gpus=tuple(int(g) for g in cell_gpus.split(",") if g.strip()), move=move,  # type: ignore[arg-type]
            measured=load_measured(measured) if measured is not None else None, seed=seed,
        )  # fmt: skip
        cfg = built.config
        for spec in specs:  # unknown names and parameters fail before anything runs
            name, params = parse_spec(spec)
            make_policy(name, **params).validate(cfg.loop)
    except (KeyError, ValueError) as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    for note in built.notes:
        console.print(note)
    runs = []
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("simulating", total=len(specs))
        for spec in specs:
            bar.update(task, description=f"simulating {spec}")
            try:
                runs.append(run_spec(cfg, spec))
            except SimulationStalled as exc:
                bar.stop()
                console.print(f"[bold red]error:[/] {escape(str(exc))}")
                console.print("A run that cannot finish has no time to compare: no ratios are printed.")
                raise typer.Exit(1) from exc
            bar.advance(task)
    _report(cfg, runs, wf.name)
    results = [r.result for r in runs]
    if plot is not None:
        plot_utilisation(results, plot, title=f"{wf.name}, {cfg.loop.steps} steps")
        console.print(f"plot: {plot}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps([summary(r) for r in runs], indent=2))
        console.print(f"json: {json_out}")


def _workload(name: str) -> WorkloadFile:
    from .sim import load_workload, shipped_workload

    return load_workload(Path(name)) if name.endswith(".toml") else shipped_workload(name)


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
    workload: Annotated[
        str | None,
        typer.Option(help="refit a workload file's (or shipped workload's) published statistics instead"),
    ] = None,
    mean_execution_h: Annotated[float, typer.Option(help="published mean rollout (execution) time")] = 1.93,
    mean_query_h: Annotated[float, typer.Option(help="published mean query (group) time")] = 2.96,
    share_over: Annotated[float, typer.Option(help="published share of queries over --over-h")] = 0.0951,
    over_h: Annotated[float, typer.Option()] = 4.0,
    timeout_h: Annotated[float, typer.Option(help="execution timeout (not published: assumed)")] = 6.0,
    group_size: Annotated[int, typer.Option()] = 16,
) -> None:
    """Fit the duration model to published statistics (defaults: QwenGyre, NL2RepoBench on 122B)."""
    from .sim import DurationModel, calibrate

    fixed: dict[str, float] = {}
    start: tuple[float, float, float] | None = None
    targets: dict[str, float] = {"mean_execution_h": mean_execution_h, "mean_query_h": mean_query_h,
                                 "share_queries_over": share_over}  # fmt: skip
    if workload is not None:
        try:
            wf = _workload(workload)
        except ValueError as exc:
            console.print(f"[bold red]error:[/] {escape(str(exc))}")
            raise typer.Exit(2) from exc
        d = wf.durations
        if not isinstance(d, DurationModel):
            console.print(f"[bold red]error:[/] {wf.name} resamples recorded groups: there is nothing to fit")
            raise typer.Exit(2)
        pub = dict(wf.published)
        over_h = pub.pop("over_h", over_h)
        targets = pub
        timeout_h, group_size = d.timeout_s / 3600, d.group_size
        start = (d.scale_h, d.shape, d.sigma_task)
        if len(targets) < 3:  # fewer statistics than parameters: keep the file's shape and spread, fit the scale
            fixed = {"shape": d.shape, "sigma_task": d.sigma_task}
    try:
        c = calibrate(
            "fitted", mean_execution_h=targets.get("mean_execution_h"), mean_query_h=targets.get("mean_query_h"),
            share_queries_over=targets.get("share_queries_over"),
            share_complete_queries_over=targets.get("share_complete_queries_over"), over_h=over_h,
            timeout_s=timeout_h * 3600, group_size=group_size, fixed=fixed, start=start,
        )  # fmt: skip
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    table = Table(title="calibration")
    for col in ("statistic", "published", "fitted"):
        table.add_column(col)
    rows = {
        "mean_execution_h": ("mean execution (h)", "{:.3f}"),
        "mean_query_h": ("mean query (h)", "{:.3f}"),
        "share_queries_over": (f"queries over {over_h:g} h", "{:.2%}"),
        "share_complete_queries_over": (f"complete queries over {over_h:g} h", "{:.2%}"),
    }
    for key, (label, fmt) in rows.items():
        want = targets.get(key)
        table.add_row(label, "-" if want is None else fmt.format(want), fmt.format(getattr(c.fitted, key)))
    table.add_row("executions timed out", "-", f"{c.fitted.share_timed_out:.3%}")
    table.add_row("queries with a member at the timeout", "-", f"{c.fitted.share_queries_timed_out:.2%}")
    console.print(table)
    m = c.model
    how = f" (shape and spread kept: {', '.join(fixed)})" if fixed else ""
    console.print(f"model: scale {m.scale_h:.4f} h, Weibull shape {m.shape:.4f}, task sigma {m.sigma_task:.4f}, "
                  f"timeout {m.timeout_s / 3600:g} h{how}")  # fmt: skip


@sim_app.command("fit")
def fit_cmd(
    db: Annotated[str, typer.Option(help="SQLAlchemy URL of the store (the scheduler's and the proxy's projections)")],
    name: Annotated[str, typer.Option(help="the workload's name")],
    out: Annotated[Path, typer.Option(help="write the workload file here (.toml)")],
    kind: Annotated[str, typer.Option(help="empirical (the recorded groups) or fitted (the 3-parameter model)")] = (
        "empirical"
    ),
    timeout_h: Annotated[float | None, typer.Option(help="the executions' timeout, if they do not carry it")] = None,
    model_like: Annotated[
        str | None, typer.Option(help="take the model's sizes from this workload (the store has no parameter counts)")
    ] = None,
) -> None:
    """Fit a workload file from our own stores: durations from the scheduler's ledger, tokens from the
    proxy's trajectory store."""
    from sqlalchemy import create_engine

    from .sim import dump_workload, fit_workload, read_store

    if kind not in ("empirical", "fitted"):
        console.print(f"[bold red]error:[/] --kind must be empirical or fitted, not {kind!r}")
        raise typer.Exit(2)
    engine = create_engine(db)
    try:
        like = _workload(model_like) if model_like else None
        with engine.connect() as conn:
            sample = read_store(conn, timeout_h=timeout_h)
        wf = fit_workload(sample, name=name, source=f"fitted from {engine.url.render_as_string(hide_password=True)}",
                          kind=kind, model_like=like)  # type: ignore[arg-type]  # fmt: skip
    except ValueError as exc:
        console.print(f"[bold red]error:[/] {escape(str(exc))}")
        raise typer.Exit(2) from exc
    finally:
        engine.dispose()
    dump_workload(wf, out)
    p = wf.published
    console.print(
        f"{len(sample.groups_s)} complete groups of {len(sample.groups_s[0])} ({sample.skipped_groups} skipped: "
        f"incomplete or another size); mean execution {p['mean_execution_h']:.3f} h, mean query "
        f"{p['mean_query_h']:.3f} h, {p['share_queries_over']:.1%} of queries over {p['over_h']:.2f} h"
    )
    if sample.context_tokens is None:
        console.print("no trajectory store on this database: the file has no model tokens")
    else:
        console.print(
            f"{sample.executions_with_calls} executions in the trajectory store: largest call "
            f"{sample.context_tokens:,.0f} tokens, {sample.trained_tokens or 0:,.0f} stored, on average"
        )
    console.print(f"workload file: {out}")
