"""Reward curve of the closed loop with the real model: SFT warm start then RL, against a control run at learning
rate ~0 on the same seeded tasks.

Both runs are the whole loop on the embedded stack (`opengyre.loop.run_loop`): svc-synth builds the same tasks
from the same seed (checked: the task ids and versions must match), the Harbor verifier grades the real workspace,
the trainer trains with GSPO. The warm start is computed once (SFT on the tasks' reference solutions, the demo's
`sft_warm_start`) and both runs start from that one checkpoint, so the only difference between them is the RL
learning rate: `--lr` for the RL run, `--control-lr` (default 1e-12: the optimizer steps, the weights do not move
measurably) for the control. Same engine seed, same sampling temperature, same group sizes.

Prints the mean reward per step side by side and the difference, then the CPU seconds and wall time of each run
(with the load). The runs go one after the other.

    .venv/bin/python bench/loop_learning.py                    # the documented size (docs/benchmarks.md)
    .venv/bin/python bench/loop_learning.py --steps 2 --group-size 2 --sft-epochs 1   # a quick look
    .venv/bin/python bench/loop_learning.py --init .opengyre/runs/demo-XXXX/warm-start/checkpoint  # reuse a demo's SFT
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from opengyre.config import Settings
from opengyre.loop import LoopResult, RunConfig, TaskRef, WarmStart, run_loop, sft_warm_start

SKILLS = ["csv-report", "text-cleanup", "log-triage"]


@dataclass
class Run:
    name: str
    lr: float
    result: LoopResult | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    load: str = ""


def config(args: argparse.Namespace, run_id: str, lr: float) -> RunConfig:
    capacity = -(-args.group_size * len(SKILLS) // args.cells)
    harness = ["--max-turns", str(args.max_turns), "--max-tokens", str(args.max_tokens), "--command-timeout", "20"]
    return RunConfig(
        run_id=run_id, seed=args.seed, skill_names=SKILLS, tasks_per_skill=1, challenges=1, level=0,
        model=args.model, cells=args.cells, cell_capacity=capacity, group_size=args.group_size,
        groups_per_step=len(SKILLS), steps=args.steps, policy="colocate", max_lag=0, timeout_s=240.0, lr=lr,
        sft_epochs=args.sft_epochs, sft_lr=args.sft_lr,
        harness_args=[*harness, "--temperature", str(args.temperature)],
    ).validate()  # fmt: skip


def shared_warm_start(args: argparse.Namespace, keep: Path) -> WarmStart:
    """The SFT once (the first run's tasks); later runs get a copy of the same checkpoint."""
    sft = sft_warm_start(
        args.model, epochs=args.sft_epochs, lr=args.sft_lr, seed=args.seed, max_tokens=args.max_tokens, say=print
    )

    async def warm(tasks: list[TaskRef], folder: Path) -> Path | None:
        if args.init is not None and not keep.exists():  # a warm start made before on the same seeded tasks
            await asyncio.to_thread(shutil.copytree, args.init, keep)
        if not keep.exists():
            made = await sft(tasks, folder)
            assert made is not None
            await asyncio.to_thread(shutil.copytree, made, keep)
        dest = folder / "checkpoint"
        if not dest.exists():
            await asyncio.to_thread(shutil.copytree, keep, dest)
        return dest

    return warm


def per_step(result: LoopResult) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for f in result.finished:
        if f.score is not None:
            out.setdefault(f.assignment.step, []).append(f.score)
    return out


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--cells", type=int, default=2)
    ap.add_argument("--sft-epochs", type=int, default=6)
    ap.add_argument("--sft-lr", type=float, default=2.5e-4)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--control-lr", type=float, default=1e-12)
    ap.add_argument("--max-turns", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--data-dir", type=Path, default=None, help="keep the runs' data here (default: a temp dir)")
    ap.add_argument(
        "--init",
        type=Path,
        default=None,
        help="a warm-start checkpoint already made on the same tasks (e.g. a demo's <run>/warm-start/checkpoint: "
        "same seed, skills and level); default: run the SFT here",
    )
    args = ap.parse_args()

    root = args.data_dir or Path(tempfile.mkdtemp(prefix="og-loop-learning-"))
    warm = shared_warm_start(args, root / "sft-checkpoint")
    runs = [Run("rl", args.lr), Run("control", args.control_lr)]
    for r in runs:
        cfg = config(args, f"ll-{r.name}", r.lr)
        settings = Settings(data_dir=root / r.name)
        print(f"=== {r.name}: lr {r.lr:g}, {cfg.steps} steps of {len(SKILLS)} groups of {cfg.group_size}")
        t0, c0 = time.monotonic(), os.times()
        r.result = asyncio.run(run_loop(cfg, settings, say=print, warm_start=warm))
        c1 = os.times()
        r.wall_s = time.monotonic() - t0
        r.cpu_s = c1.user + c1.system + c1.children_user + c1.children_system - sum(c0[:4])
        r.load = ", ".join(f"{x:.1f}" for x in os.getloadavg())

    rl, control = (r.result for r in runs)
    assert rl is not None and control is not None
    same = sorted((t.task_id, t.version) for t in rl.tasks) == sorted((t.task_id, t.version) for t in control.tasks)
    print(f"\ntasks: {', '.join(t.task_id for t in rl.tasks)} (the same in both runs: {same})")
    if not same:
        raise SystemExit("the two runs built different tasks: the comparison is void")
    a, b = per_step(rl), per_step(control)
    print(f"\n{'step':>4} {'RL (lr ' + format(args.lr, 'g') + ')':>16} {'control':>10} {'RL - control':>13}")
    for step in sorted(set(a) | set(b)):
        ma, mb = mean(a.get(step, [])), mean(b.get(step, []))
        print(
            f"{step:>4} {ma:>16.3f} {mb:>10.3f} {ma - mb:>+13.3f}   (n = {len(a.get(step, []))}, {len(b.get(step, []))})"
        )
    later = [s for s in sorted(set(a) | set(b)) if s > 1]  # step 1 runs on the same SFT weights in both
    la = [x for s in later for x in a.get(s, [])]
    lb = [x for s in later for x in b.get(s, [])]
    print(
        f"steps 2+: RL {mean(la):.3f} vs control {mean(lb):.3f} ({mean(la) - mean(lb):+.3f}; n = {len(la)}, {len(lb)})"
    )
    for r in runs:
        assert r.result is not None
        steps = r.result.steps
        published = [s.weight_version for s in steps if s.weight_version]
        print(
            f"{r.name:8} {len([s for s in steps if s.n_trained])} of {len(steps)} steps trained, weights "
            f"{', '.join(published) or 'none'}, {r.result.hardened} hardened; {r.cpu_s:.0f} CPU-s, "
            f"{r.wall_s:.0f} s wall (load {r.load})"
        )
    print(f"data: {root}")


if __name__ == "__main__":
    main()
