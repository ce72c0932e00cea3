"""Wall-clock requests/s our load generator sustains against a trivially fast server on this machine: the figure
the CPU-cost measurement (``client_capacity.py``) can only predict. Meant for an idle machine; it runs anywhere
and says the load beside the rate, so a figure from a busy machine is recognisable as one.

    .venv/bin/python svc-bench/bench/wall_rate.py                 # ~100 s: 1 and 2 worker processes
    .venv/bin/python svc-bench/bench/wall_rate.py --seconds 20    # a quick look

Same server and request as ``client_capacity.py`` (``_fast_server.py``, one streamed chat completion with one
output token, C in flight; the server runs on the same cores). For each worker count: a short calibration run
sizes one continuous run of about ``--seconds`` at the rate just seen; printed per run: requests, wall seconds,
the sustained rate (requests over the run's wall time, from its first send to its last reply), the rate over the
middle 80 % of replies (no ramp-up or tail), the client's own CPU per request while sending (workers' start-up
excluded), whether the watchdog flagged the client's event loop as lagging (loop lateness p99 > 50 ms: then the
client, not the server, set the pace), and the load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from _fast_server import start  # type: ignore[import-not-found]  # the folder beside, put on sys.path above

from opengyre.bench import LoadConfig, RunResult, SessionPlan, TurnPlan, run_load

AIM = 5000.0


def _plans(n: int) -> list[SessionPlan]:
    return [SessionPlan(f"s{i}", (TurnPlan(({"role": "user", "content": "hi"},), 1),)) for i in range(n)]


async def _run(url: str, n: int, c: int, workers: int) -> RunResult:
    run = await run_load(LoadConfig(url, "m", concurrency=c, workers=workers, ignore_eos=False), _plans(n))
    if run.partial:
        raise SystemExit(f"the run failed: {run.errors[:3]}")
    return run


def _middle_rate(run: RunResult) -> float:
    """Replies per second between the 10th and the 90th percentile of reply times."""
    ends = sorted(r.sent + (r.e2el or 0.0) for r in run.requests)
    lo, hi = ends[len(ends) // 10], ends[len(ends) * 9 // 10]
    return (len(ends) * 8 // 10) / max(hi - lo, 1e-9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=40.0, help="length of each measured run")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--workers", default="1,2", help="worker process counts to run, e.g. 1,2")
    ap.add_argument("--max-requests", type=int, default=800_000)
    a = ap.parse_args()
    url, procs = start(1)
    load0 = os.getloadavg()
    print(f"server {url}; C={a.concurrency}; {os.cpu_count()} CPUs; load average before {load0}", flush=True)
    best = 0.0
    try:
        for w in (int(x) for x in a.workers.split(",")):
            calib = asyncio.run(_run(url, 4000 * w, a.concurrency, w))
            rate = len(calib.requests) / (calib.finished - calib.started)
            n = max(4000, min(a.max_requests, int(rate * a.seconds)))
            run = asyncio.run(_run(url, n, a.concurrency, w))
            wall = run.finished - run.started
            rps, mid = n / wall, _middle_rate(run)
            best = max(best, rps)
            flag = "FLAGGED (client-bound)" if run.client_bottleneck else "not flagged"
            print(
                f"{w} worker(s): {n} requests in {wall:.1f} s = {rps:,.0f} req/s sustained "
                f"({mid:,.0f} req/s over the middle 80 %); client CPU {run.client_cpu_s / n * 1e3:.3f} ms/request; "
                f"watchdog {flag}, loop lateness p99 {run.loop_lag_p99_s * 1e3:.1f} ms, max "
                f"{run.loop_lag_max_s * 1e3:.0f} ms; load average now {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    finally:
        for p in procs:
            p.terminate()
    verdict = "met" if best >= AIM else "NOT met"
    print(f"best sustained: {best:,.0f} req/s; aim >= {AIM:,.0f} req/s {verdict}; load average after {os.getloadavg()}")


if __name__ == "__main__":
    main()
