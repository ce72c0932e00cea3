"""What a sandboxed command costs: the namespace backend (bubblewrap) against the process backend (``none``,
the launcher the sandbox had before), in one process, one after the other, ratios printed.

    .venv/bin/python bench/sandbox_bench.py [--runs 40]

Per command: wall time (start to result) and CPU time (this process and every process it reaped: the launcher,
bwrap and its init, the command; ``RUSAGE_SELF`` + ``RUSAGE_CHILDREN``), for ``true`` and a small Python
(``python -c pass``), with the default limits (a pids cgroup where one can be made, the disk watcher), and for
the namespace backend with one egress endpoint (its launcher is a Python start). Kernel work that runs in no
process's name (a network namespace's teardown, in a kernel worker) is in neither figure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from opengyre.sandbox import LocalSandbox, SandboxLimits


class CpuMeter:
    """CPU seconds of this process and everything it started: a cgroup v1 ``cpuacct`` group this process moves
    into (its descendants inherit it whoever reaps them), else rusage (self + reaped children).

    rusage misses the namespace sandbox's processes: bwrap's outer process does not reap the namespace's init (it
    learns the exit status through a pipe), so their CPU is never added to ``RUSAGE_CHILDREN`` here."""

    def __init__(self) -> None:
        self.group: Path | None = None
        parent = Path("/sys/fs/cgroup/cpuacct")
        try:
            group = parent / f"og-sandbox-bench-{os.getpid()}"
            group.mkdir()
            (group / "cgroup.procs").write_text(str(os.getpid()))
            self.group = group
        except OSError:
            self.group = None
        self.how = "cpuacct cgroup" if self.group else "rusage (self + reaped children; misses the namespace's)"

    def now(self) -> float:
        if self.group is not None:
            return int((self.group / "cpuacct.usage").read_text()) / 1e9
        own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime

    def close(self) -> None:
        if self.group is not None:
            with contextlib.suppress(OSError):
                (self.group.parent / "cgroup.procs").write_text(str(os.getpid()))
                self.group.rmdir()


METER: CpuMeter | None = None


def _cpu() -> float:
    assert METER is not None
    return METER.now()


def measure(backend: str, argv: list[str], runs: int, egress: list[str]) -> tuple[float, float]:
    """(median wall ms, mean CPU ms) per command."""
    walls, cpu = [], 0.0
    with LocalSandbox(SandboxLimits(timeout_s=60), backend=backend, egress=egress) as sb:
        sb.run(argv)  # warm: caches, probes
        for _ in range(runs):
            c0, t0 = _cpu(), time.perf_counter()
            r = sb.run(argv)
            walls.append(time.perf_counter() - t0)
            cpu += _cpu() - c0
            if not r.ok:
                raise SystemExit(f"{backend} {argv}: {r.exit_code} {r.stderr}")
    return statistics.median(walls) * 1000, cpu / runs * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=40)
    args = ap.parse_args()
    import logging

    logging.getLogger("opengyre.sandbox").setLevel(logging.ERROR)  # the none backend's warning per sandbox
    global METER
    METER = CpuMeter()
    print(
        f"CPU measured by {METER.how}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"{args.runs} runs each"
    )
    try:
        _table(args.runs)
    finally:
        METER.close()


def _table(runs: int) -> None:
    commands = {"true": ["true"], "python -c pass": [sys.executable, "-c", "pass"]}
    print(f"{'command':<16} {'backend':<18} {'wall ms':>8} {'cpu ms':>8} {'wall x':>7} {'cpu x':>7}")
    for label, argv in commands.items():
        base_wall, base_cpu = measure("none", argv, runs, [])
        print(f"{label:<16} {'none':<18} {base_wall:8.1f} {base_cpu:8.1f} {1:7.2f} {1:7.2f}")
        for name, backend, egress in (
            ("namespace", "namespace", []),
            ("namespace+egress", "namespace", ["127.0.0.1:65000"]),
        ):
            wall, cpu = measure(backend, argv, runs, egress)
            print(f"{label:<16} {name:<18} {wall:8.1f} {cpu:8.1f} {wall / base_wall:7.2f} {cpu / base_cpu:7.2f}")


if __name__ == "__main__":
    main()
