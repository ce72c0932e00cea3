"""svc-scheduler benchmark: every figure of the "svc-scheduler" section of docs/benchmarks.md.

Every comparison is at equal trained work and equal composition (each policy trains the same groups; the
script checks it and says so), async and A3 at their best fixed split, ratios against elastic run in the same
process. Sections (``--sections``, default all but the grid and the full-size speed run):

  calibration  the workloads against the published statistics (122B: three numbers; 2.4T: one)
  knobs        slots per cell and micro-step derived from published facts; the least phi the published time allows
  headline     elastic vs colocate, async, A3, C2, E2 and ours, with move costs (KV migration, re-prefill)
  ours         elastic-carry vs elastic at equal trained work over phi; the dropping variant for comparison
  moves        what moving executions costs (free, KV migration, re-prefill)
  large        the 2.4T run: the ratios, and one modelling assumption changed at a time
  grid         the sensitivity of the ratios to the two knobs (plot: --grid-plot)
  speed        simulator events/s at 8, 64, 512 and 4,096 cells (--speed-steps; --full for 4,096 x 48;
               --baseline COMMIT: ratios against that commit's scheduler, run alternately in this process)

Run: .venv/bin/python svc-scheduler/bench/scheduler_bench.py [--seeds 3] [--sections headline,ours]
     [--measured FILE --columns measured-1-re-prefill,measured-1-kv,measured-9-re-prefill,measured-9-kv]
     [--plot docs/scheduler-utilisation.png] [--grid-plot docs/scheduler-sensitivity.png] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from opengyre.scheduler import LoopConfig, SchedulerState
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import (
    NL2REPO_122B,
    ClusterConfig,
    MoveMode,
    PolicyRun,
    SimConfig,
    SimResult,
    Simulator,
    calibrate,
    comparable,
    derive_knobs,
    feasible_lag,
    load_measured,
    measure,
    plot_sensitivity,
    plot_utilisation,
    run_spec,
    setup,
    shipped_workload,
    simulate,
)

PAPER_122B = {"async": (1.42, 1.53), "colocate": (1.36, 1.47), "a3_saving": 0.116, "e2_slower": 0.022, "c2": 1.193}
PAPER_24T = {"colocate": 91.47 / 75.42, "async": 134.55 / 75.42}
# The earlier, unpublished knobs, chosen so the ratios land in the paper's ranges: only from their named file.
TUNED_NAME = "nl2repo-122b-tuned"


def section(title: str) -> None:
    print(f"\n## {title}", flush=True)


def mean_range(xs: list[float]) -> str:
    return f"{statistics.mean(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def trained_line(r: SimResult) -> str:
    t = r.trained
    return (
        f"trained {t.groups}/{t.dispatched_groups} groups, lost {t.lost_gpu_h:.0f} GPU-h, queries >4h "
        f"{t.share_queries_over_4h:.1%}, p90 {t.p90_query_h:.2f} h, p99 {t.p99_query_h:.2f} h"
    )


def check_equal(runs: dict[str, PolicyRun]) -> str:
    base = runs["elastic"].result
    odd = [k for k, r in runs.items() if not comparable(r.result, base)]
    return "equal trained work and composition: yes" if not odd else f"NOT equal for {', '.join(odd)}"


def headline(cfg: SimConfig, seed: int) -> dict[str, PolicyRun]:
    c = replace(cfg, seed=seed)
    cl = c.cluster
    runs = {s: run_spec(c, s) for s in ("elastic", "colocate", "async", "async-streaming", "elastic-carry")}
    # C2: 2 of the cells resident (rollout only); E2: half as many cells, twice the nodes (same GPUs and slots/GPU).
    c2 = replace(c, cluster=replace(cl, cells=cl.cells - 2, resident_cells=2))
    runs["C2"] = run_spec(c2, "colocate-resident")
    e2 = replace(c, cluster=replace(cl, cells=cl.cells // 2, nodes_per_cell=cl.nodes_per_cell * 2,
                                    slots_per_cell=cl.slots_per_cell * 2))  # fmt: skip
    runs["E2"] = run_spec(e2, "elastic")
    return runs


def run_headline(name: str, cfg: SimConfig, seeds: int, out: dict[str, Any]) -> dict[str, PolicyRun]:
    print(f"\n### {name}")
    ratios: dict[str, list[float]] = {k: [] for k in ("colocate", "async", "a3_saving", "c2", "e2", "ours")}
    first: dict[str, PolicyRun] = {}
    for seed in range(seeds):
        runs = headline(cfg, seed)
        el = runs["elastic"].result.hours
        ratios["colocate"].append(runs["colocate"].result.hours / el)
        ratios["async"].append(runs["async"].result.hours / el)
        ratios["a3_saving"].append(1 - runs["async-streaming"].result.hours / runs["async"].result.hours)
        ratios["c2"].append(runs["C2"].result.hours / el)
        ratios["e2"].append(runs["E2"].result.hours / el - 1)
        ratios["ours"].append(el / runs["elastic-carry"].result.hours)
        print(
            f"seed {seed}: "
            + " | ".join(
                f"{k} {r.result.hours:.1f} h" + (f" (split {r.split})" if r.split else "") for k, r in runs.items()
            )
            + f" | {check_equal({k: v for k, v in runs.items() if k not in ('C2', 'E2')})}"
        )
        if seed == 0:
            first = runs
            for k, r in runs.items():
                res = r.result
                print(
                    f"  {k:16s} x ideal {res.hours / res.bound.hours:.3f}  busy {res.utilisation:.1%}  staleness "
                    f"{res.staleness_mean:.3f} ({res.staleness_max})  moves {res.moves} (+{res.move_gpu_h:.0f} GPU-h)"
                    f"  {trained_line(res)}"
                )
            b = runs["elastic"].result.bound
            print(f"  ideal bound (same trained work, any policy, staleness <= {b.max_staleness}): "
                  f"GPU-work/GPUs {b.work_h:.1f} h, chain {b.chain_h:.1f} h")  # fmt: skip
    print(f"colocate / elastic  {mean_range(ratios['colocate'])}   paper 1.36-1.47")
    print(f"async / elastic     {mean_range(ratios['async'])}   paper 1.42-1.53")
    print(f"A3 saving on async  {mean_range(ratios['a3_saving'])}   paper 0.116")
    print(f"C2 / elastic        {mean_range(ratios['c2'])}   paper 19.23 / 16.12 = 1.193")
    print(f"E2 (half the cells) {mean_range(ratios['e2'])}   paper +0.022")
    print(f"elastic / ours      {mean_range(ratios['ours'])}   (>1: ours faster)")
    out[name] = {"ratios": ratios, "seed0": {k: {**r.result.summary(), "split": r.split} for k, r in first.items()}}
    return first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sections", default="calibration,knobs,headline,ours,moves,large,speed")
    ap.add_argument("--plot", type=Path, help="utilisation plot of the headline (derived knobs, phi = 1)")
    ap.add_argument("--grid-plot", type=Path, help="the sensitivity grid's plot (runs the grid section)")
    ap.add_argument("--speed-steps", type=int, default=2, help="steps for the 512- and 4,096-cell speed runs")
    ap.add_argument("--full", action="store_true", help="speed: also 4,096 cells x 48 steps")
    ap.add_argument("--baseline", help="speed: also run the scheduler of this git commit, in this process")
    ap.add_argument("--speed-reps", type=int, default=3, help="speed with --baseline: alternating runs, best CPU")
    ap.add_argument("--columns", help="headline: only these columns (comma-separated keys; default all)")
    ap.add_argument(
        "--measured",
        type=Path,
        help="headline: also the columns whose move costs come from this "
        "measurement of the built engine (svc-scheduler/bench/move_costs.py --out; sim.load_measured)",
    )
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    todo = set(args.sections.split(",")) | ({"grid"} if args.grid_plot else set())
    out: dict[str, Any] = {}
    w122, w24 = shipped_workload("nl2repo-122b"), shipped_workload("nl2repo-2.4t")
    w_tuned = shipped_workload(TUNED_NAME)
    tk = w_tuned.knobs
    assert tk is not None
    assert w122.run and w122.model and w24.run and w24.model

    if "calibration" in todo:
        section("calibration")
        refit = calibrate("nl2repo-122b", mean_execution_h=1.93, mean_query_h=2.96, share_queries_over=0.0951)
        got = measure(NL2REPO_122B, groups=100_000, seed=1)
        print(f"122B on 100k groups: mean execution {got.mean_execution_h:.3f} h (1.93), mean query "
              f"{got.mean_query_h:.3f} h (2.96), queries over 4 h {got.share_queries_over:.2%} (9.51%), executions "
              f"at the 6 h timeout {got.share_timed_out:.3%}")  # fmt: skip
        m = refit.model
        print(f"122B refit: scale {m.scale_h:.4f} h, shape {m.shape:.4f}, task sigma {m.sigma_task:.4f}")
        got24 = measure(w24.durations, groups=100_000, seed=1)
        refit24 = calibrate("nl2repo-2.4t", share_complete_queries_over=0.611, timeout_s=6 * 3600,
                            fixed={"shape": m.shape, "sigma_task": m.sigma_task},
                            start=(3.0, m.shape, m.sigma_task))  # fmt: skip
        print(f"2.4T on 100k groups: complete queries over 4 h {got24.share_complete_queries_over:.2%} (61.1%), all "
              f"queries over 4 h {got24.share_queries_over:.2%}, queries with a member at the 6 h timeout "
              f"{got24.share_queries_timed_out:.2%}, mean execution {got24.mean_execution_h:.2f} h, mean query "
              f"{got24.mean_query_h:.2f} h; refit scale {refit24.model.scale_h:.4f} h")  # fmt: skip
        out["calibration"] = {"122b": got.__repr__(), "2.4t": got24.__repr__()}

    derived = setup(w122, move="kv-migration").config
    lag122 = feasible_lag(derived, w122.run.hours)
    lag24 = feasible_lag(setup(w24, move="kv-migration").config, w24.run.hours)
    if "knobs" in todo:
        section("knobs derived from published facts")
        for wf in (w122, w24):
            assert wf.run and wf.model
            kn = derive_knobs(wf.run, wf.model, wf.gpu, wf.durations)
            print(f"{wf.name}: {kn.explain()}")
            print(f"  assumed: {wf.assumed}")
            out.setdefault("knobs", {})[wf.name] = {
                "slots_per_cell": kn.slots_per_cell,
                "micro_step_s": kn.micro_step_s,
            }
        print(f"least phi under which the published time is possible at all: 122B {lag122}, 2.4T {lag24}")
        out["feasible_lag"] = {"122b": lag122, "2.4t": lag24}

    if "headline" in todo:
        section("headline: 122B, equal trained work, moves by re-prefill (built) or KV migration (assumed cost)")
        # The derived knobs first (what SimConfig() and `opengyre sim run` use); the tuned set only from its file.
        columns: dict[str, tuple[str, SimConfig]] = {
            "derived-1-re-prefill": ("derived knobs, phi=1, re-prefill", setup(w122, move="re-prefill").config),
            "derived-1-kv": ("derived knobs, phi=1, KV migration (assumed cost)", derived),
            f"derived-{lag122}-kv": (f"derived knobs, phi={lag122} (least phi the published time allows), KV "
                                     "migration (assumed cost)", replace(derived, loop=replace(derived.loop,
                                                                                              max_lag=lag122))),
            f"derived-{lag122}-re-prefill": (f"derived knobs, phi={lag122}, re-prefill",
                                             setup(w122, move="re-prefill", max_lag=lag122).config),
            "tuned-1-re-prefill": (f"tuned knobs ({TUNED_NAME}), phi=1, re-prefill",
                                   setup(w_tuned, move="re-prefill").config),
            "tuned-1-kv": (f"tuned knobs ({TUNED_NAME}), phi=1, KV migration (assumed cost)",
                           setup(w_tuned, move="kv-migration").config),
        }  # fmt: skip
        if args.measured:
            mm = load_measured(args.measured)
            print(mm.explain(w122.gpu))
            for lag in (1, lag122):
                modes: tuple[tuple[MoveMode, str], ...] = (("re-prefill", "re-prefill"), ("kv-migration", "kv"))
                for mode, key in modes:
                    columns[f"measured-{lag}-{key}"] = (
                        f"derived knobs, phi={lag}, {mode} at the measured cost ({args.measured.name})",
                        setup(w122, move=mode, max_lag=lag, measured=mm).config,
                    )
        wanted = args.columns.split(",") if args.columns else list(columns)
        unknown = sorted(set(wanted) - set(columns))
        if unknown:
            raise SystemExit(f"unknown --columns {', '.join(unknown)}; known: {', '.join(columns)}")
        firsts = {key: run_headline(*columns[key], args.seeds, out) for key in wanted}
        if args.plot and "derived-1-re-prefill" in firsts:
            first = firsts["derived-1-re-prefill"]
            res = [first[k].result for k in ("elastic", "colocate", "async", "async-streaming", "elastic-carry")]
            plot_utilisation(res, args.plot, title="NL2RepoBench-122B, derived knobs, phi = 1, re-prefill moves")
            print(f"plot: {args.plot}")

    if "ours" in todo:
        section("ours (elastic-carry) vs elastic at equal trained work, seed 0")
        print("knobs    phi  elastic h (mean staleness)  ours h (mean, max)  elastic / ours   dropping variant")
        rows = []
        for label, cfg in (("tuned", setup(w_tuned, move="kv-migration").config), ("derived", derived)):
            for lag in sorted({1, 2, 4, 6, lag122}):
                c = replace(cfg, loop=replace(cfg.loop, max_lag=lag))
                el, ours = simulate(c, make_policy("elastic")), simulate(c, make_policy("elastic-carry"))
                drop = simulate(
                    c, make_policy("elastic-carry", drop_stale=1, extra_groups=3 * c.loop.groups_per_step // 4)
                )
                same = comparable(el, ours)
                rows.append({"knobs": label, "phi": lag, "elastic": el.summary(), "ours": ours.summary(),
                             "drop": drop.summary()})  # fmt: skip
                print(
                    f"{label:8s} {lag:3d}  {el.hours:8.1f} ({el.staleness_mean:.2f})          {ours.hours:7.1f} "
                    f"({ours.staleness_mean:.2f}, {ours.staleness_max})   {el.hours / ours.hours:.3f}"
                    f"{'' if same else ' UNEQUAL'}          {drop.hours:.1f} h, {trained_line(drop)}"
                )
        out["ours"] = rows

    if "moves" in todo:
        section("moves: what moving running executions costs (elastic, seed 0)")
        for label, cfg in (("tuned", setup(w_tuned).config), ("derived", setup(w122, max_lag=lag122).config)):
            base = None
            for mode in ("free", "kv-migration", "re-prefill"):
                c = replace(cfg, costs=replace(cfg.costs, move=replace(cfg.costs.move, mode=mode)))
                r = simulate(c, make_policy("elastic"))
                base = base or r.hours
                per = r.move_slot_h * 3600 / r.moves if r.moves else 0.0
                print(f"{label:8s} phi={c.loop.max_lag:<2d} {mode:13s} {r.hours:7.1f} h  x{r.hours / base:.3f}  moves "
                      f"{r.moves}, {per:.0f} slot-s each, +{r.move_gpu_h:.0f} GPU-h")  # fmt: skip
                out.setdefault("moves", []).append({"knobs": label, "mode": mode, **r.summary()})

    if "large" in todo:
        section("the 2.4T run (4 cells x 48 nodes): the simulator against the paper's direction")
        print(f"paper: colocate / elastic {PAPER_24T['colocate']:.3f}, async / elastic {PAPER_24T['async']:.3f}")
        big: list[dict[str, Any]] = []
        for lag in (1, lag24):
            for wf, label in ((w122, "122B"), (w24, "2.4T")):
                cb = setup(wf, move="kv-migration", max_lag=lag if wf is w24 else (1 if lag == 1 else lag122)).config
                pruns = {sp: run_spec(cb, sp) for sp in ("elastic", "colocate", "async")}
                eh = pruns["elastic"].result.hours
                print(
                    f"{label} phi={cb.loop.max_lag}: elastic {eh:.1f} h, colocate / elastic "
                    f"{pruns['colocate'].result.hours / eh:.3f}, async / elastic "
                    f"{pruns['async'].result.hours / eh:.3f} (split {pruns['async'].split}); {check_equal(pruns)}"
                )
        base24 = setup(w24, move="kv-migration", max_lag=lag24).config
        t5 = calibrate("nl2repo-2.4t-5h", share_complete_queries_over=0.611, timeout_s=5 * 3600,
                       fixed={"shape": NL2REPO_122B.shape, "sigma_task": NL2REPO_122B.sigma_task},
                       start=(3.0, NL2REPO_122B.shape, NL2REPO_122B.sigma_task)).model  # fmt: skip
        variants = {
            "as derived": base24,
            "moves by re-prefill": setup(w24, move="re-prefill", max_lag=lag24).config,
            "switches x60 (8.5 min / 3.5 min)": replace(
                base24, costs=replace(base24.costs, to_training_s=511.2, to_rollout_s=207.6)
            ),
            "training x4 per step": replace(
                base24, costs=replace(base24.costs, micro_step_s=base24.costs.micro_step_s * 4)
            ),
            "timeout 5 h (durations crowd the limit)": replace(base24, workload=t5),
            "8 cells x 24 nodes": setup(w24, move="kv-migration", max_lag=lag24, cells=8, nodes_per_cell=24).config,
            "async at half the cells (not tuned)": base24,
        }
        print(f"\n2.4T at phi={lag24}, one assumption changed at a time:")
        for label, cv in variants.items():
            e_h = simulate(cv, make_policy("elastic")).hours
            c_h = simulate(cv, make_policy("colocate")).hours
            if label.startswith("async at half"):
                split = cv.cluster.cells // 2
                a_h = simulate(cv, make_policy("async", train_cells=split)).hours
            else:
                ar = run_spec(cv, "async")
                a_h, split = ar.result.hours, ar.split or 0
            big.append({"variant": label, "elastic": e_h, "colocate": c_h, "async": a_h, "split": split})
            print(
                f"  {label:42s} elastic {e_h:6.1f} h  colocate / elastic {c_h / e_h:.3f}  async / elastic "
                f"{a_h / e_h:.3f} (split {split})"
            )
        print("\n2.4T: how hard durations crowd the timeout (the one statistic refitted per timeout), against phi:")
        for hours in (8.0, 6.0, 5.5, 5.0, 4.5):
            fit = calibrate(f"nl2repo-2.4t-{hours:g}h", share_complete_queries_over=0.611, timeout_s=hours * 3600,
                            fixed={"shape": NL2REPO_122B.shape, "sigma_task": NL2REPO_122B.sigma_task},
                            start=(3.0, NL2REPO_122B.shape, NL2REPO_122B.sigma_task))  # fmt: skip
            row: list[str] = []
            for lag in (lag24, lag24 + 1):
                ct = replace(setup(w24, move="kv-migration", max_lag=lag).config, workload=fit.model)
                t_el = simulate(ct, make_policy("elastic")).hours
                t_co = simulate(ct, make_policy("colocate")).hours
                t_as = run_spec(ct, "async")
                row.append(f"phi={lag}: colocate / elastic {t_co / t_el:.3f}, async / elastic "
                             f"{t_as.result.hours / t_el:.3f} (split {t_as.split})")  # fmt: skip
                big.append({"timeout_h": hours, "phi": lag, "elastic": t_el, "colocate": t_co,
                            "async": t_as.result.hours})  # fmt: skip
            print(f"  timeout {hours:g} h ({fit.fitted.share_queries_timed_out:.0%} of queries reach it): "
                  + "; ".join(row), flush=True)  # fmt: skip
        out["large"] = big

    if "grid" in todo:
        section("sensitivity of the ratios to the two knobs (122B, phi = 1, KV migration, seed 0)")
        grid: dict[tuple[int, float], dict[str, float]] = {}
        for slots in (32, 64, 128, 256, 512, 1024):
            for micro in (60.0, 150.0, 300.0, 600.0, 1200.0):
                cg = setup(w122, move="kv-migration", slots_per_cell=slots, micro_step_s=micro).config
                g_el = simulate(cg, make_policy("elastic")).hours
                g_co = simulate(cg, make_policy("colocate")).hours
                g_as = run_spec(cg, "async")
                grid[(slots, micro)] = {"colocate": g_co / g_el, "async": g_as.result.hours / g_el}
                print(
                    f"slots {slots:5d} micro {micro:6.0f} s: colocate / elastic {g_co / g_el:.3f}, async / elastic "
                    f"{g_as.result.hours / g_el:.3f} (split {g_as.split})",
                    flush=True,
                )
        kg = derive_knobs(w122.run, w122.model, w122.gpu, w122.durations)
        for key in ("colocate", "async"):
            vals = [v[key] for v in grid.values()]
            print(f"{key} / elastic over the grid: {min(vals):.3f}-{max(vals):.3f}")
        out["grid"] = {f"{s},{m}": v for (s, m), v in grid.items()}
        if args.grid_plot:
            plot_sensitivity(
                grid, args.grid_plot, panels=[("colocate", "colocate / elastic (paper 1.36-1.47)"),
                                              ("async", "async at its best split / elastic (paper 1.42-1.53)")],
                marks={"tuned": (tk.slots_per_cell, tk.micro_step_s), "derived": (kg.slots_per_cell, kg.micro_step_s)},
                title="NL2RepoBench-122B, 8 cells x 32 GPUs, phi = 1, 48 steps, equal trained work",
            )  # fmt: skip
            print(f"plot: {args.grid_plot}")

    if "speed" in todo:
        section("simulator speed (elastic, the paper's load per cell: 64 executions per cell per step)")
        base = None
        if args.baseline:
            from _baseline import load_baseline  # type: ignore[import-not-found]  # this script's folder

            base = load_baseline(args.baseline)
            print(f"baseline: the scheduler package of {args.baseline}, in this process; runs alternate, "
                  f"best of {args.speed_reps}")  # fmt: skip
        speeds = []
        for cells, steps in ((8, 48), (64, 48), (512, args.speed_steps), (4096, args.speed_steps)) + (
            ((4096, 48),) if args.full else ()
        ):
            sp: dict[str, Any] = {"cells": cells, "steps": steps}
            for rep in range(args.speed_reps if base else 1):
                impls = [("now", make_policy, SimConfig, LoopConfig, ClusterConfig, simulate)]
                if base:
                    bpkg, bsim, bpol = base
                    impls.append(("base", bpol.make_policy, bsim.SimConfig, bpkg.LoopConfig, bsim.ClusterConfig,
                                  bsim.simulate))  # fmt: skip
                    if rep % 2:
                        impls.reverse()  # alternate which runs first: the load changes under us
                for tag, mk, sc, lc, cc, sim in impls:
                    # The tuned file's knobs, passed explicitly to both trees (a baseline's predates the file):
                    # the recorded speed figures were measured with them.
                    cs = sc(loop=lc(steps=steps, groups_per_step=4 * cells),
                            cluster=cc(cells=cells, slots_per_cell=tk.slots_per_cell),
                            costs=replace(sc().costs, micro_step_s=tk.micro_step_s))  # fmt: skip
                    w0, c0 = time.perf_counter(), time.process_time()
                    r = sim(cs, mk("elastic"))
                    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
                    best = sp.get(tag)
                    if best is None or cpu < best["cpu_s"]:
                        sp[tag] = {"events": r.events, "wall_s": wall, "cpu_s": cpu, "summary": r.summary()}
            now = sp["now"]
            line = (f"{cells:5d} cells x {steps:2d} steps: {now['events']:,} events, {now['wall_s']:.1f} s wall, "
                    f"{now['cpu_s']:.1f} s CPU, {now['events'] / now['wall_s']:,.0f} events/s wall, "
                    f"{now['events'] / now['cpu_s']:,.0f} per CPU-s")  # fmt: skip
            if base:
                b = sp["base"]
                agree = "yes" if b["summary"] == now["summary"] and b["events"] == now["events"] else "NO"
                line += (f"; baseline {b['events'] / b['cpu_s']:,.0f} per CPU-s ({b['cpu_s']:.1f} s CPU): "
                         f"x{b['cpu_s'] / now['cpu_s']:.2f} faster, same results: {agree}")  # fmt: skip
            speeds.append(sp)
            print(line, flush=True)
        out["speed"] = speeds
        # The live controller's in-memory fold (``SchedulerState.apply``, the code the simulator folds through)
        # over a recorded run's events: events per CPU-second at a small and a large cluster.
        folds = []
        for cells, steps in ((8, 48), (512, 2)):
            cs = SimConfig(loop=LoopConfig(steps=steps, groups_per_step=4 * cells),
                           cluster=ClusterConfig(cells=cells, slots_per_cell=tk.slots_per_cell),
                           costs=replace(SimConfig().costs, micro_step_s=tk.micro_step_s), record_events=True)  # fmt: skip
            rec = Simulator(cs, make_policy("elastic"))
            rec.run()
            best = float("inf")
            for _ in range(args.speed_reps):
                st = SchedulerState()
                c0 = time.process_time()
                for seq, e in enumerate(rec.events, 1):
                    st.apply(e, seq)
                best = min(best, time.process_time() - c0)
            assert st.snapshot() == rec.state.snapshot()
            folds.append({"cells": cells, "steps": steps, "events": len(rec.events), "cpu_s": best})
            print(
                f"state fold, {cells:4d} cells x {steps:2d} steps: {len(rec.events):,} events in {best:.2f} CPU-s, "
                f"{len(rec.events) / best:,.0f} events per CPU-s (same state as the simulator's: yes)",
                flush=True,
            )
        out["fold"] = folds

    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))


if __name__ == "__main__":
    main()
