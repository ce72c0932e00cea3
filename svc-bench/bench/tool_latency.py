"""What tool and think time between turns does to C*: the same sweep with and without it, one server.

    .venv/bin/python svc-bench/bench/tool_latency.py --out docs/bench-tool-latency.png

The server is ``opengyre.bench.TimedServer`` over real HTTP with a known capacity: ``--slots`` requests served
at a time (the rest wait), each taking TTFT + (tokens − 1)·ITL. So the answer is known: a session keeps the
server busy for S per request and then runs its tools for T, so C sessions offer C·S/(S + T) requests' worth of
work at a time, and C* ≈ slots·(S + T)/S. The sweep has to find that, which makes the figure a check of the
sweep as much as an illustration: on an inference server S grows with C (batching), so the shift is not this
clean, but it goes the same way — an agent's tool time is slots the server does not see.

Printed: per tool latency, the throughput at each C, C* with the set of C the step tests leave compatible, and
C* against the baseline without tool time (a ratio from the same process) beside the model's prediction.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from opengyre.bench import DelayDist, LengthDist, Profile, SweepResult, TimedServer, sweep_profile
from opengyre.models import load_tokenizer

TTFT, ITL, TOKENS = 0.030, 0.010, 3  # S = 50 ms per request


def _profile(tool_s: float) -> Profile:
    const = LengthDist("constant", 4)
    return Profile(
        "agent",
        const,
        LengthDist("constant", 2),
        LengthDist("constant", TOKENS),
        LengthDist("constant", 3),
        description="three turns, 3-token replies",
        tool_latency=DelayDist("lognormal", tool_s, 0.5) if tool_s > 0 else None,
    )


async def _sweep(tool_s: float, slots: int, cs: list[int], tok: Any) -> SweepResult:
    srv = await TimedServer(TTFT, ITL, slots=slots).start()
    try:
        return await sweep_profile(
            srv.url,
            "timed",
            _profile(tool_s),
            cs,
            tok,
            sessions_per_slot=2,
            repeats=3,
            max_repeats=8,
            tolerance=0.15,
            beyond=1,
        )
    finally:
        await srv.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--tools", default="0,0.05,0.15", help="mean tool latencies (s), the first the baseline")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--out", type=Path, default=Path("bench-results/tool-latency.png"))
    args = ap.parse_args()
    tools = [float(x) for x in args.tools.split(",")]
    cs = [int(x) for x in args.concurrency.split(",")]
    tok = load_tokenizer()
    service = TTFT + (TOKENS - 1) * ITL
    results: dict[float, SweepResult] = {}
    for t in tools:
        res = asyncio.run(_sweep(t, args.slots, cs, tok))
        results[t] = res
        curve = ", ".join(f"C={p.concurrency}: {p.mean:.1f}" for p in res.curve)
        print(f"tool latency {t * 1e3:.0f} ms: {curve} req/s; C* = {res.c_star} (compatible {res.compatible})")
    base = results[tools[0]].c_star
    print(f"\nS = {service * 1e3:.0f} ms per request, {args.slots} slots; model: C* ~ slots (S + T) / S")
    for t, res in results.items():
        predicted = args.slots * (service + t) / service
        ratio = f"{res.c_star / base:.2f}x" if res.c_star and base else "-"
        print(f"T = {t * 1e3:4.0f} ms: C* = {res.c_star} ({ratio} the baseline), model {predicted:.1f}")
    _plot(args.out, results, args.slots, service)
    print(f"wrote {args.out}")


def _plot(path: Path, results: dict[float, SweepResult], slots: int, service: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    for t, res in results.items():
        cs = [p.concurrency for p in res.curve]
        means = [p.mean for p in res.curve]
        lo = [m - iv[0] if (iv := p.interval) else 0.0 for p, m in zip(res.curve, means, strict=True)]
        hi = [iv[1] - m if (iv := p.interval) else 0.0 for p, m in zip(res.curve, means, strict=True)]
        line = ax.errorbar(cs, means, yerr=[lo, hi], marker="o", capsize=3, label=f"tool {t * 1e3:.0f} ms")
        if res.c_star is not None:
            ax.axvline(res.c_star, color=line[0].get_color(), ls="--", lw=1)
    ax.axhline(slots / service, color="grey", ls=":", lw=1, label="server capacity")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("concurrency C (sessions in flight)")
    ax.set_ylabel("request throughput (req/s)")
    ax.set_title(f"C* (dashed) moves with tool time: {slots} slots, {service * 1e3:.0f} ms per request", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    main()
