"""Cell-idle fraction of the live closed loop, elastic against colocate, and the simulator's prediction of each.

Both live runs are the same seeded small workload (one csv-report task, the tiny model, 2 CPU cells of 2 slots,
groups of 4, ``--steps`` on-policy steps, the scripted solver harness of tests/e2e so the rewards carry a signal
and every step trains); only the scheduler policy differs. Each run's event log is folded by
``opengyre.report`` (``RunSummary.cell_use``, what `opengyre report` shows: the definition of idle is there).

The prediction: the scheduler's simulator (the same policy code) on the same configuration (cells, slots, group
size, groups per step, steps, max lag), with a workload built from that live run alone: its groups' measured
execution durations (dispatch to finish), its mean training-step time (last finish of the step's executions to
the step's event) as the micro-step, its mean measured switch times (none measured: 0, said so). The simulator
records its events, and the same fold computes the same fraction from them, so live and predicted are measured
alike; the simulator's own GPU accounting is printed beside it as a check.

    nice -n 5 .venv/bin/python bench/cell_idle.py                # 3 steps per run (~5 min at load 10)
    nice -n 5 .venv/bin/python bench/cell_idle.py --steps 2 --keep /tmp/idle
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pickle
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

from opengyre.config import Settings
from opengyre.eventlog import EventLog
from opengyre.events import CellRoleChanged, Event, ExecutionDispatched, ExecutionFinished, TrainingStepCompleted
from opengyre.harness import HarnessSpec
from opengyre.loop import LoopResult, RunConfig, run_loop
from opengyre.report import CellUse, fold_events
from opengyre.runtime import Stack
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import ClusterConfig, CostConfig, EmpiricalDurations, MoveCost, SimConfig, Simulator

ROOT = Path(__file__).resolve().parents[1]
SOLVER = ROOT / "tests" / "e2e" / "_solver_harness.py"  # members m0-m2 solve, m3 does nothing: a signal
POLICIES = ("colocate", "elastic")
Events = list[tuple[int, Event]]


def solver_spec(tasks_root: Path) -> HarnessSpec:
    return HarnessSpec(
        name="scripted-solver",
        argv=(
            "{python}", str(SOLVER), "--tasks-root", str(tasks_root), "--solved", "3", "--model", "{model}",
            "--instruction-file", "{instruction_file}", "--summary-file", "{summary_file}",
        ),
        env={"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}"},
    )  # fmt: skip


def run_config(policy: str, steps: int) -> RunConfig:
    return RunConfig(
        run_id=f"idle-{policy}", seed=0, skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"],
        tasks_per_skill=1, challenges=1, level=0, model="tiny", cells=2, cell_capacity=2, group_size=4,
        groups_per_step=1, steps=steps, policy=policy, max_lag=0, timeout_s=120, lr=1e-3,
    )  # fmt: skip


async def live(cfg: RunConfig, data: Path) -> tuple[Events, LoopResult, float]:
    """The run, and every event of its log (read before the stack stops)."""
    events: Events = []

    async def keep(stack: Stack, _: LoopResult) -> None:
        log = await EventLog.connect(stack.nats_url, stack.settings.log, credentials=stack.admin_credentials)
        try:
            events.extend([(s.seq, log.decode(s)) async for s in log.read()])
        finally:
            await log.close()

    t0 = time.monotonic()
    res = await run_loop(cfg, Settings(data_dir=data), say=lambda _: None, spec=solver_spec(data / "synth"),
                         before_stop=keep)  # fmt: skip
    return events, res, time.monotonic() - t0


def measured(events: Events) -> tuple[list[list[float]], list[float], list[float], list[float]]:
    """From a run's log: its groups' execution durations, its training-step times, its switch times (into
    training, back to rollout), all seconds."""
    dispatched = {e.execution_id: e for _, e in events if isinstance(e, ExecutionDispatched)}
    finished = {e.execution_id: e for _, e in events if isinstance(e, ExecutionFinished)}
    groups: dict[str, list[float]] = {}
    for xid, d in dispatched.items():
        f = finished.get(xid)
        if f is not None:
            groups.setdefault(d.group_id, []).append((f.occurred_at - d.occurred_at).total_seconds())
    step_s = []
    for _, e in events:
        if isinstance(e, TrainingStepCompleted):
            ends = [finished[x].occurred_at for x in (*e.execution_ids, *e.dropped) if x in finished]
            if ends:
                step_s.append((e.occurred_at - max(ends)).total_seconds())
    to_training: list[float] = []
    to_rollout: list[float] = []
    since: dict[str, float] = {}
    for _, e in events:
        if isinstance(e, CellRoleChanged):
            at = e.occurred_at.timestamp()
            if e.to_role in ("draining", "switching") and e.from_role not in ("draining", "switching"):
                since[e.cell_id] = at
            elif e.from_role in ("draining", "switching") and e.cell_id in since:
                (to_rollout if e.to_role == "rollout" else to_training).append(at - since.pop(e.cell_id))
    return list(groups.values()), step_s, to_training, to_rollout


def dispatch_gaps(events: Events) -> list[float]:
    """Seconds from each training step's event to the first dispatch of the next step: the driver's own time
    (the engines reload the weights, it sees them served, asks for the task's newest version, dispatches), which
    the simulator does not have (it dispatches as soon as the policy allows)."""
    done = {e.step: e.occurred_at for _, e in events if isinstance(e, TrainingStepCompleted)}
    first: dict[int, float] = {}
    for _, e in events:
        if isinstance(e, ExecutionDispatched) and e.step - 1 in done:
            first.setdefault(e.step, (e.occurred_at - done[e.step - 1]).total_seconds())
    return [first[s] for s in sorted(first)]


def predict(cfg: RunConfig, events: Events) -> tuple[CellUse | None, dict[str, float], str]:
    """The simulator on ``cfg`` with the workload measured in ``events``: the fold's cell use of its events, the
    simulator's own GPU shares, and what was measured."""
    groups, step_s, to_training, to_rollout = measured(events)
    complete = [g for g in groups if len(g) == cfg.group_size]
    if not complete or not step_s:
        raise RuntimeError("the live run has no complete group or no training step to build a workload from")

    def mean(xs: list[float]) -> float:
        return statistics.fmean(xs) if xs else 0.0

    sim_cfg = SimConfig(
        loop=LoopConfig(steps=cfg.steps, groups_per_step=cfg.groups_per_step, group_size=cfg.group_size,
                        max_lag=cfg.max_lag),
        cluster=ClusterConfig(cells=cfg.cells, nodes_per_cell=1, gpus_per_node=1, slots_per_cell=cfg.cell_capacity),
        # The CPU trainer is one process: a micro-step takes the measured step time on whichever cell runs it.
        costs=CostConfig(micro_step_s=mean(step_s), reference_gpus=1, step_overhead_s=0.0,
                         to_training_s=mean(to_training), to_rollout_s=mean(to_rollout), move=MoveCost("free")),
        workload=EmpiricalDurations("live", tuple(tuple(g) for g in complete), cfg.timeout_s),
        seed=cfg.seed,
        record_events=True,
    )  # fmt: skip
    sim = Simulator(sim_cfg, make_policy(cfg.policy))
    result = sim.run()
    folded = fold_events([(i + 1, e) for i, e in enumerate(sim.events)])
    gpu_h = sum(result.totals.values())
    shares = {k: v / gpu_h for k, v in result.totals.items()} if gpu_h else {}
    what = (
        f"{len(complete)} groups (executions {min(min(g) for g in complete):.1f}-{max(max(g) for g in complete):.1f} "
        f"s), step {mean(step_s):.1f} s (n={len(step_s)}), to training {mean(to_training):.1f} s "
        f"(n={len(to_training)}), to rollout {mean(to_rollout):.1f} s (n={len(to_rollout)})"
    )
    return folded.cell_use, shares, what


def _cpu() -> float:
    """CPU seconds of this process and its waited-for children (the services, engines and harnesses)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def fmt(u: CellUse | None) -> str:
    if u is None:
        return "(no cell use: no dispatch or no step in the log)"
    return (
        f"idle {u.idle:6.1%}  (rollout slots idle {u.rollout_idle:6.1%}, training idle {u.training_idle:6.1%})  "
        f"busy {u.busy:6.1%}  switching {u.switching:6.1%}  over {u.window_s:6.1f} s x {u.cells} cells"
    )


async def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--keep", type=Path, help="keep the runs' data dirs and event logs (events.pickle) here")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="cell-idle-"))
    print(f"load average at start: {os.getloadavg()[0]:.1f} (2-core machine, shared)")
    rows = []
    for policy in POLICIES:
        cfg = run_config(policy, args.steps)
        cpu0 = _cpu()
        events, res, wall = await live(cfg, root / policy)
        with (root / f"{policy}.events.pickle").open("wb") as f:
            pickle.dump(events, f)
        live_use = fold_events(events).cell_use
        predicted, shares, what = predict(cfg, events)
        gaps = ", ".join(f"{g:.2f}" for g in dispatch_gaps(events))
        rows.append((policy, live_use, predicted, shares, f"{what}; live dispatch gaps after steps: {gaps} s"))
        print(
            f"{policy}: {len(res.finished)} executions, {len(res.steps)} steps, {wall:.0f} s wall, "
            f"{_cpu() - cpu0:.0f} CPU-s (this process and the stack's, engines', harnesses' processes), "
            f"load {os.getloadavg()[0]:.1f}"
        )
    print()
    for policy, live_use, predicted, shares, what in rows:
        print(f"{policy}")
        print(f"  live       {fmt(live_use)}")
        print(f"  simulated  {fmt(predicted)}")
        if shares:
            idle = shares["rollout_idle"] + shares["training_idle"]
            print(
                f"  simulator's own GPU shares: idle {idle:6.1%} (rollout {shares['rollout_idle']:6.1%}, training "
                f"{shares['training_idle']:6.1%}), busy {shares['rollout_busy'] + shares['training_busy']:6.1%}, "
                f"other {shares['other']:6.1%}"
            )
        print(f"  workload measured live: {what}")
    print()
    by = {p: (lv, pr) for p, lv, pr, _, _ in rows}
    lc, pc = by["colocate"]
    le, pe = by["elastic"]
    if lc and le and pc and pe and lc.idle and pc.idle:
        print(f"elastic / colocate idle fraction: live {le.idle / lc.idle:.2f}, simulated {pe.idle / pc.idle:.2f}")
    print(f"event logs: {root}")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
