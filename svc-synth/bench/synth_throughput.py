"""Validated tasks per minute in procedural mode: ingest the example skills, synthesize tasks (two challenges each,
knobs at a level), build each as a Harbor task directory and run every gate in the sandbox.

    .venv/bin/python svc-synth/bench/synth_throughput.py [--tasks 40] [--workers 8] [--level 1]
    .venv/bin/python svc-synth/bench/synth_throughput.py --tasks 24 --baseline a09833e --reps 2

Without ``--baseline`` the baseline in the same run is one worker (tasks one after another); the figure is the
concurrent run (``--workers``), which overlaps the sandboxes' waiting (the hang gate's timeout, process start-up).

With ``--baseline REV`` the same work runs alternately (``--reps`` times each) against that commit's code and
today's: REV's ``libs``, ``svc-synth`` and ``svc-trainer`` trees are taken with ``git archive`` and put first on
the import path of a child process; today's run in an identical child process. Each child measures its own CPU
(itself and every process it reaped: sandboxes, graders, solutions), so the figure that matters, CPU-seconds per
validated task, does not depend on what else the machine runs; the wall-clock rate does, so the load is printed.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

EXAMPLES = Path(__file__).parents[1] / "skills"
ROOT = Path(__file__).resolve().parents[2]
TREES = ("libs", "svc-synth", "svc-trainer")  # what the synth pipeline runs: its package, the kernel, the verifier


def _cpu() -> float:
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run(n: int, workers: int, level: int, hang_s: float, root: Path) -> tuple[float, float, int]:
    from opengyre.synth import GateLimits, Synthesizer, ingest  # imported here: --baseline children pick the tree

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


def _load() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def _child(args: argparse.Namespace, tree: Path | None) -> dict[str, Any]:
    """One measured run in a fresh interpreter; ``tree``: an extracted commit whose packages shadow today's."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(str(tree / t) for t in TREES)
    argv = [sys.executable, __file__, "--child", "--tasks", str(args.tasks), "--workers", str(args.workers)]
    argv += ["--level", str(args.level), "--hang-s", str(args.hang_s)]
    done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
    where = done.stderr.strip().splitlines()[-1].split(": ", 1)[1]
    if (tree is not None) != where.startswith(str(tree or "/nonexistent")):
        raise SystemExit(f"the child ran the wrong tree: {where}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "tree": where}


def _extract(rev: str, where: Path) -> Path:
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *TREES], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(where, filter="data")
    return where


def _row(name: str, r: dict[str, Any], n: int) -> str:
    per = r["cpu"] / max(r["ok"], 1)
    return (
        f"{name:<18} {int(r['ok'])}/{n} validated  {r['wall']:6.1f} s wall  {r['cpu']:6.1f} CPU-s "
        f"({per:.3f} CPU-s/validated task)  {r['ok'] / r['wall'] * 60:6.1f} tasks/min wall  "
        f"{120 / per:5.0f} tasks/min on 2 free cores  [{r['load']}]"
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--level", type=int, default=1)
    ap.add_argument("--hang-s", type=float, default=1.0, help="how long the hanging solution is let run")
    ap.add_argument("--baseline", help="git commit to compare with, run alternately in child processes")
    ap.add_argument("--reps", type=int, default=2, help="with --baseline: alternating runs of each")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as tmp:
            load = _load()
            wall, cpu, ok = run(args.tasks, args.workers, args.level, args.hang_s, Path(tmp))
        import opengyre.sandbox

        # which tree ran: a baseline child must have imported the extracted commit's code, not today's
        print(f"sandbox package: {Path(opengyre.sandbox.__file__ or '').parent}", file=sys.stderr)
        print(json.dumps({"wall": wall, "cpu": cpu, "ok": ok, "load": load}))
        return
    if args.baseline:
        with tempfile.TemporaryDirectory(prefix="synth-baseline-") as tmp:
            _compare(args, _extract(args.baseline, Path(tmp)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        res = []
        for w in (1, args.workers):
            load = _load()
            wall, cpu, ok = run(args.tasks, w, args.level, args.hang_s, Path(tmp))
            res.append((wall, ok))
            print(_row(f"workers={w}", {"wall": wall, "cpu": cpu, "ok": ok, "load": load}, args.tasks))
        base, conc = (ok / wall for wall, ok in res)
        print(f"ratio vs 1 worker: {conc / base:.2f}x")


def _compare(args: argparse.Namespace, tree: Path) -> None:
    rows: dict[str, list[dict[str, Any]]] = {"baseline": [], "today": []}
    print(f"{args.tasks} tasks, {args.workers} workers, level {args.level}; baseline {args.baseline}")
    for rep in range(args.reps):
        for name, where in (("baseline", tree), ("today", None)):
            r = _child(args, where)
            rows[name].append(r)
            print(_row(f"{name} #{rep + 1}", r, args.tasks), flush=True)
    per = {k: sum(r["cpu"] for r in v) / max(sum(r["ok"] for r in v), 1) for k, v in rows.items()}
    print(
        f"CPU-s per validated task: baseline {per['baseline']:.3f}, today {per['today']:.3f} "
        f"(x{per['baseline'] / per['today']:.2f} less); on 2 free cores {120 / per['baseline']:.0f} -> "
        f"{120 / per['today']:.0f} validated tasks/min"
    )


if __name__ == "__main__":
    main()
