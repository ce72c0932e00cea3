"""CPU seconds one stack start costs: `opengyre up` in the foreground until it reports the stack up, then stopped.

    .venv/bin/python bench/stack_start_cost.py [--base REV] [-n 3]

What the suite's stack-starting tests pay per stack, before any test work: the supervisor, nats-server and the
five services, each process's start included (the figure is user+sys of the supervisor and every process it
waited for, ``resource.getrusage(RUSAGE_CHILDREN)`` around the run). The stack runs on a fresh data dir with
PYTHONDONTWRITEBYTECODE=1, as on the machines the suite runs on. ``new`` is this worktree, its bytecode compiled
first (``make test`` does that); ``--base REV`` adds that revision's sources as they ran before (``git archive``,
on PYTHONPATH ahead of this worktree's, no bytecode), alternating run by run with ``new``. The supervisor's
children inherit the environment, so they import the same variant's sources.
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("apps", "libs", "svc-bench", "svc-proxy", "svc-scheduler", "svc-synth", "svc-trainer")
# printed by `up` once every service reported its port (apps/opengyre/cli/_stack.py)
READY_LINE = "Ctrl-C stops the stack"


def one_stack(env: dict[str, str], data: Path) -> tuple[float, float]:
    """CPU seconds (user+sys, every process) and wall seconds from `up` until the stack reported itself up."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    argv = [sys.executable, "-m", "opengyre.cli", "up", "--data-dir", str(data)]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    seen: list[str] = []
    for line in proc.stdout:  # blocks on the supervisor's own output: up, or its exit on a failed start
        seen.append(line)
        if READY_LINE in line:
            break
    up_s = time.monotonic() - t0
    proc.send_signal(signal.SIGTERM)
    rest = proc.stdout.read()
    if proc.wait() != 0 or not any(READY_LINE in s for s in seen):
        raise SystemExit(f"`opengyre up` failed ({proc.returncode}):\n{''.join(seen)}{rest}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), up_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="a git revision to compare against (its sources, this venv)")
    ap.add_argument("-n", type=int, default=3, help="stack starts per variant")
    args = ap.parse_args()
    base_env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "4000"}
    for r in SOURCE_ROOTS:  # as `make bytecode`
        compileall.compile_dir(ROOT / r / "opengyre", quiet=1, workers=0)
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"new": dict(base_env)}
        if args.base:
            tree = Path(tmp, "base")
            archive = subprocess.run(
                ["git", "-C", str(ROOT), "archive", args.base, *SOURCE_ROOTS], check=True, capture_output=True
            )
            with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
                tar.extractall(tree, filter="data")
            pythonpath = os.pathsep.join(str(tree / r) for r in SOURCE_ROOTS)
            variants = {"base": {**base_env, "PYTHONPATH": pythonpath}, **variants}
        cpu: dict[str, list[float]] = {v: [] for v in variants}
        wall: dict[str, list[float]] = {v: [] for v in variants}
        for i in range(args.n):
            for v in list(variants) if i % 2 == 0 else list(reversed(variants)):
                c, w = one_stack(variants[v], Path(tmp, f"data-{v}-{i}"))
                cpu[v].append(c)
                wall[v].append(w)
                print(f"  {v}: {c:.2f} CPU-s, up in {w:.1f} s", flush=True)
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    for v in variants:
        print(
            f"{v:5s} median {statistics.median(cpu[v]):6.2f} CPU-s per stack start (up in {statistics.median(wall[v]):.1f} s)"
        )
    if args.base:
        print(f"new/base {statistics.median(cpu['new']) / statistics.median(cpu['base']):.2f}")


if __name__ == "__main__":
    main()
