"""Validated tasks per minute in procedural mode: ingest the example skills, synthesize tasks (two challenges each,
knobs at a level), build each as a Harbor task directory and run every gate in the sandbox.

The baseline in the same process is one worker (tasks one after another); the figure is the concurrent run
(``--workers``), which overlaps the sandboxes' waiting (the hang gate's timeout, process start-up).

    .venv/bin/python svc-synth/bench/synth_throughput.py [--tasks 40] [--workers 6] [--level 1]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from opengyre.synth import GateLimits, Synthesizer, ingest

EXAMPLES = Path(__file__).parents[1] / "skills"


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run(n: int, workers: int, level: int, hang_s: float, root: Path) -> tuple[float, float, int]:
    skills = ingest(EXAMPLES, root / "skills").accepted
    synth = Synthesizer(root / f"store-{workers}", GateLimits(hang_timeout_s=hang_s), workers=workers)
    jobs = [(skills[i % len(skills)], 1000 + i) for i in range(n)]
    t0, c0 = time.perf_counter(), _cpu()
    builds = synth.synthesize_many(jobs, level=level)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    ok = sum(b.ok for b in builds)
    for b in builds:
        if not b.ok:
            print("  failed:", b.blueprint.task_id, [(v.gate, v.reason) for v in b.verdicts if not v.ok])
    return wall, cpu, ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=1.0, help="how long the hanging solution is let run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for w in (1, args.workers):
            wall, cpu, ok = run(args.tasks, w, args.level, args.hang_s, Path(tmp))
            rate = ok / wall * 60
            rows.append((w, wall, cpu, ok, rate))
            print(
                f"workers={w}: {ok}/{args.tasks} validated in {wall:.1f} s wall, {cpu:.1f} CPU-s "
                f"({cpu / args.tasks:.2f} CPU-s/task): {rate:.1f} validated tasks/min"
            )
        base = rows[0][4]
        print(f"ratio vs 1 worker: {rows[1][4] / base:.2f}x")
        print(f"CPU-bound ceiling on 2 cores: {2 * 60 / (rows[1][2] / args.tasks):.0f} tasks/min")


if __name__ == "__main__":
    main()
