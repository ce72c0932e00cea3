"""CPU seconds a process start pays for its imports, per entry point the stack and the suite start.

    .venv/bin/python bench/import_cost.py [--base REV] [-n 5]

Each entry point's import runs in a fresh interpreter, ``-n`` times; the figure is the child's user+sys CPU
(``resource.getrusage(RUSAGE_CHILDREN)`` around the wait), median over the runs. With ``--base REV`` the same
imports also run against that revision's sources (``git archive`` into a temporary folder, put on the child's
``sys.path`` in place of this worktree's source roots), alternating base and this tree run by run, so load drifts
on a shared machine hit both alike. Reports the load average before and after (CPU figures are what to read).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE_ROOTS = ("apps", "libs", "svc-bench", "svc-proxy", "svc-scheduler", "svc-synth", "svc-trainer")


# What a service's start imports beyond its class (its function-level imports in start/add_to_server).
_STARTS = {
    "proxy": "opengyre.proxy._grpc, opengyre.proxy.gateway, opengyre.proxy.engines._cells, "
    "opengyre.proxy.recording._restore, opengyre.proxy.recording._trees, opengyre.tito",
}


def _service(name: str) -> str:
    # what `python -m opengyre.cli service run NAME` imports until it serves: the CLI, its service, what it starts
    code = f"import opengyre.cli; from opengyre.runtime import load_service; load_service({name!r})"
    return code + (f"; import {_STARTS[name]}" if name in _STARTS else "")


# Each process the stack or the suite starts, as the imports it makes before doing its work.
ENTRY_POINTS: dict[str, str] = {
    "opengyre (CLI, `up`)": "import opengyre.cli",
    **{f"service run {s}": _service(s) for s in ("synth", "scheduler", "proxy", "trainer", "bench")},
    # engine_command's own imports (torch and transformers among them: the engine needs them to serve)
    "python -m opengyre.engine": "import opengyre.engine.__main__, opengyre.engine._launch",
    "python -m opengyre.harness": "import opengyre.harness.__main__",
    "python -m opengyre.healthcheck": "import opengyre.healthcheck",
    "python -m opengyre.scheduler.worker": "import opengyre.scheduler.worker",
    "python -m opengyre.trainer._cell_main": "import opengyre.trainer._cell_main",
}


def _base_tree(rev: str, into: Path) -> None:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, *SOURCE_ROOTS], check=True, capture_output=True)
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")


def _prelude(base: Path | None) -> str:
    if base is None:
        return ""
    swap = {str(ROOT / r): str(base / r) for r in SOURCE_ROOTS}
    return f"import sys; sys.path[:] = [{swap!r}.get(p, p) for p in sys.path]; "


def cpu_of(code: str, cwd: Path) -> float:
    """User+sys CPU seconds of one fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="a git revision to compare against (its sources, this venv)")
    ap.add_argument("-n", type=int, default=5, help="runs per entry point and variant")
    ap.add_argument("--only", help="entry points whose name contains this")
    args = ap.parse_args()
    names = [n for n in ENTRY_POINTS if args.only is None or args.only in n]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[str, Path | None] = {"new": None}
        if args.base:
            _base_tree(args.base, Path(tmp))
            variants = {"base": Path(tmp), "new": None}
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(args.n):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in names:
                for v in order:
                    code = _prelude(variants[v]) + ENTRY_POINTS[name]
                    cpu.setdefault((name, v), []).append(cpu_of(code, Path(tmp)))
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    width = max(map(len, names))
    if args.base:
        print(f"{'entry point':{width}}  base CPU-s  new CPU-s  new/base   (median of {args.n})")
    else:
        print(f"{'entry point':{width}}  CPU-s   (median of {args.n})")
    tot = dict.fromkeys(variants, 0.0)
    for name in names:
        med = {v: statistics.median(cpu[name, v]) for v in variants}
        for v in variants:
            tot[v] += med[v]
        if args.base:
            print(f"{name:{width}}  {med['base']:10.2f}  {med['new']:9.2f}  {med['new'] / med['base']:8.2f}")
        else:
            print(f"{name:{width}}  {med['new']:5.2f}")
    if args.base:
        print(f"{'sum':{width}}  {tot['base']:10.2f}  {tot['new']:9.2f}  {tot['new'] / tot['base']:8.2f}")


if __name__ == "__main__":
    main()
