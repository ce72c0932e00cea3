"""CPU seconds a process start pays for its imports, per entry point the stack and the suite start.

    .venv/bin/python bench/import_cost.py [--base REV] [--compiled] [-n 5]

Each entry point's import runs in a fresh interpreter, ``-n`` times; the figure is the child's user+sys CPU
(``resource.getrusage(RUSAGE_CHILDREN)`` around the wait), median over the runs. Every variant runs from its own
copy of the source roots (put on the child's ``sys.path`` in place of this worktree's), with
PYTHONDONTWRITEBYTECODE=1 as on the machines the suite runs on: ``new`` is this tree as it is (uncommitted
changes too), ``--base REV`` adds that revision's (``git archive``), ``--compiled`` adds this tree with its
bytecode compiled beforehand (``make test`` does that: ``compileall``). Runs alternate between the variants, so
load drifts on a shared machine hit them alike. Reports the load average before and after (CPU is what to read).
"""

from __future__ import annotations

import argparse
import compileall
import os
import resource
import shutil
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


# What migrating a store imports (opengyre.store.migrate, at every service's start and in `up`).
_MIGRATE = "import alembic.command, alembic.config"


def _service(name: str) -> str:
    # what `python -m opengyre.cli service run NAME` imports until it serves: the CLI, its service, what it starts
    code = f"import opengyre.cli; from opengyre.runtime import load_service; load_service({name!r}); {_MIGRATE}"
    return code + (f"; import {_STARTS[name]}" if name in _STARTS else "")


# Each process the stack or the suite starts, as the imports it makes before doing its work.
ENTRY_POINTS: dict[str, str] = {
    "opengyre (a command)": "import opengyre.cli",
    "opengyre up (supervisor)": f"import opengyre.cli; {_MIGRATE}",
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


def _this_tree(into: Path, *, compiled: bool) -> None:
    for r in SOURCE_ROOTS:
        shutil.copytree(ROOT / r, into / r, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        if compiled:
            compileall.compile_dir(into / r / "opengyre", quiet=1, workers=0)


def _prelude(tree: Path) -> str:
    swap = {str(ROOT / r): str(tree / r) for r in SOURCE_ROOTS}
    return f"import sys; sys.path[:] = [{swap!r}.get(p, p) for p in sys.path]; "


def _postlude(tree: Path) -> str:
    # every opengyre module the child imported came from the variant's copy
    return (
        "; bad = [m for m, v in sys.modules.items() if m.startswith('opengyre') and getattr(v, '__file__', None)"
        f" and not v.__file__.startswith({str(tree)!r})]; assert not bad, bad"
    )


def cpu_of(code: str, cwd: Path) -> float:
    """User+sys CPU seconds of one fresh interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="a git revision to compare against (its sources, this venv)")
    ap.add_argument("--compiled", action="store_true", help="also this tree with its bytecode compiled beforehand")
    ap.add_argument("-n", type=int, default=5, help="runs per entry point and variant")
    ap.add_argument("--only", help="entry points whose name contains this")
    args = ap.parse_args()
    names = [n for n in ENTRY_POINTS if args.only is None or args.only in n]
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        variants: dict[str, Path] = {}
        if args.base:
            variants["base"] = Path(tmp, "base")
            _base_tree(args.base, variants["base"])
        variants["new"] = Path(tmp, "new")
        _this_tree(variants["new"], compiled=False)
        if args.compiled:
            variants["new+pyc"] = Path(tmp, "compiled")
            _this_tree(variants["new+pyc"], compiled=True)
        cpu: dict[tuple[str, str], list[float]] = {}
        for i in range(args.n):
            order = list(variants) if i % 2 == 0 else list(reversed(variants))
            for name in names:
                for v in order:
                    cpu.setdefault((name, v), []).append(
                        cpu_of(_prelude(variants[v]) + ENTRY_POINTS[name] + _postlude(variants[v]), Path(tmp))
                    )
    print(f"load average after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    width = max(map(len, names))
    first = next(iter(variants))
    cols = "".join(f"  {v + ' CPU-s':>13}" for v in variants)
    ratios = "".join(f"  {v + '/' + first:>12}" for v in variants if v != first)
    print(f"{'entry point':{width}}{cols}{ratios}   (median of {args.n})")
    tot = dict.fromkeys(variants, 0.0)
    rows = [(name, {v: statistics.median(cpu[name, v]) for v in variants}) for name in names]
    for _name, med in rows:
        for v in variants:
            tot[v] += med[v]
    for name, med in [*rows, ("sum", tot)]:
        vals = "".join(f"  {med[v]:13.2f}" for v in variants)
        rat = "".join(f"  {med[v] / med[first]:12.2f}" for v in variants if v != first)
        print(f"{name:{width}}{vals}{rat}")


if __name__ == "__main__":
    main()
