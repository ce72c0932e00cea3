"""Run reports: how long a summary of ~100,000 events takes to fold, from memory and from a real nats-server.

A simulated elastic run (the scheduler's simulator: dispatches, finishes, role changes, training steps) with one
recorded model call per execution (inline tokens, 16 in and 16 out), appended to an embedded nats-server with
file storage. In the same process:

* **fold**: ``RunFold.apply`` over the decoded events in memory, then ``summary()``; the baseline is a loop that
  only counts the events by type (what any reader of the list pays);
* **from the log**: ``summarize(log)`` (typed reads of the folded types + fold + summary) against the same typed
  read of the same range with an empty loop body (what reading and decoding alone costs);
* **HTML**: ``render_html`` of that summary (five matplotlib figures as SVG).

CPU seconds (``time.process_time``) beside wall seconds; nats-server runs in its own process.

    .venv/bin/python bench/report_bench.py                  # ~100k events
    .venv/bin/python bench/report_bench.py --steps 20       # quick (~8k events)
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from collections import Counter
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import Event, ExecutionDispatched, ModelCallRecorded
from opengyre.report import FOLDED_TYPES, RunFold, render_html, summarize
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.sim import ClusterConfig, CostConfig, DurationModel, SimConfig, Simulator


def run_events(steps: int) -> list[Event]:
    cfg = SimConfig(
        loop=LoopConfig(steps=steps, groups_per_step=16, group_size=8, max_lag=1),
        cluster=ClusterConfig(cells=4, nodes_per_cell=1, gpus_per_node=8, slots_per_cell=64),
        costs=CostConfig(micro_step_s=300.0, step_overhead_s=30.0),
        workload=DurationModel("bench", scale_h=1.0, shape=2.0, sigma_task=0.3, timeout_s=3 * 3600, group_size=8),
        seed=7,
        record_events=True,
    )
    sim = Simulator(cfg, make_policy("elastic"))
    sim.run()
    out: list[Event] = []
    for e in sim.events:
        out.append(e)
        if isinstance(e, ExecutionDispatched):
            out.append(
                ModelCallRecorded(
                    execution_id=e.execution_id, call_id=f"{e.execution_id}-c0", prompt_delta_ids=list(range(16)),
                    output_ids=list(range(16)), output_logprobs=[-0.5] * 16, weight_version=e.weight_version,
                    occurred_at=e.occurred_at,
                )
            )  # fmt: skip
    return out


def timed(fn):  # type: ignore[no-untyped-def]
    w, c = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - w, time.process_time() - c


async def timed_async(coro):  # type: ignore[no-untyped-def]
    w, c = time.perf_counter(), time.process_time()
    value = await coro
    return value, time.perf_counter() - w, time.process_time() - c


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=255)
    args = ap.parse_args()
    print(f"load before: {os.getloadavg()}")
    events = run_events(args.steps)
    pairs = list(enumerate(events, 1))
    print(f"{len(events):,} events ({Counter(e.type_name() for e in events).most_common()})")

    _, bw, bc = timed(lambda: Counter(type(e) for _, e in pairs))
    fold, fw, fc = timed(lambda: RunFold().apply_all(pairs))
    summary, sw, sc = timed(fold.summary)
    print(f"baseline count by type: {bw:.3f} s wall, {bc:.3f} s CPU")
    print(f"fold: {fw:.3f} s wall, {fc:.3f} s CPU ({len(events) / fc:,.0f} events/CPU-s, x{fc / bc:.1f} the count)")
    print(f"summary(): {sw:.3f} s wall, {sc:.3f} s CPU")
    html, hw, hc = timed(lambda: render_html(summary))
    print(
        f"render_html: {hw:.3f} s wall, {hc:.3f} s CPU ({len(summary.watermark):,} watermark points, "
        f"{len(html) / 1e6:.1f} MB)"
    )

    with tempfile.TemporaryDirectory() as tmp, EmbeddedNats(Path(tmp) / "nats") as server:
        log = await EventLog.connect(server.url, LogConfig(stream="REPORTBENCH", prefix="rb.ev"))
        try:
            await log.append_many(events)

            async def read_only() -> int:
                n = 0
                async for _ in log.events(*FOLDED_TYPES):
                    n += 1
                return n

            # The baseline before and after, so a change of load during the run shows.
            n, rw, rc = await timed_async(read_only())
            from_log, lw, lc = await timed_async(summarize(log))
            n2, rw2, rc2 = await timed_async(read_only())
            assert n == n2 == len(events) and from_log == summary, "the log's fold differs from the in-memory one"
            for label, w, c in (("before", rw, rc), ("after", rw2, rc2)):
                print(
                    f"baseline typed read of the log ({label}): {w:.2f} s wall, {c:.2f} s CPU ({n / w:,.0f} events/s)"
                )
            mean_w, mean_c = (rw + rw2) / 2, (rc + rc2) / 2
            print(
                f"summarize(log): {lw:.2f} s wall, {lc:.2f} s CPU (x{lw / mean_w:.2f} wall, x{lc / mean_c:.2f} CPU "
                "the read alone)"
            )
        finally:
            await log.close()
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    asyncio.run(main())
