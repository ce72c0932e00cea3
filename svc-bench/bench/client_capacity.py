"""How many short streamed requests per second the load generator sustains, against a trivially fast server.

    .venv/bin/python svc-bench/bench/client_capacity.py                  # 20,000 requests per client
    .venv/bin/python svc-bench/bench/client_capacity.py --requests 3000  # a quick look

Same server, same work (single-turn sessions, one streamed chat completion each, C in flight), in one process,
one after another: the ``openai`` SDK (AsyncOpenAI, streaming, one client, what many harnesses and benchmark
scripts use) as the baseline, then ours with 1 and 2 worker processes. Figures are requests/s and the ratio to
the baseline; TTFT is checked to be measured (not a role-only chunk) for every request.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import openai
from _fast_server import start  # type: ignore[import-not-found]  # the folder beside, put on sys.path above

from opengyre.bench import LoadConfig, SessionPlan, TurnPlan, run_load


def _plans(n: int) -> list[SessionPlan]:
    return [SessionPlan(f"s{i}", (TurnPlan(({"role": "user", "content": "hi"},), 1),)) for i in range(n)]


async def _openai_sdk(url: str, n: int, c: int) -> float:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    left = n
    ttfts: list[float] = []

    async def slot() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            t0 = time.monotonic()
            stream = await client.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=1,
                stream=True,
                stream_options={"include_usage": True},
            )
            first = None
            async for ch in stream:
                if first is None and ch.choices and ch.choices[0].delta.content:
                    first = time.monotonic() - t0
            assert first is not None
            ttfts.append(first)

    t = time.monotonic()
    await asyncio.gather(*(slot() for _ in range(c)))
    dur = time.monotonic() - t
    await client.close()
    assert len(ttfts) == n
    return n / dur


async def _ours(url: str, n: int, c: int, workers: int) -> tuple[float, bool]:
    run = await run_load(LoadConfig(url, "m", concurrency=c, workers=workers, ignore_eos=False), _plans(n))
    assert not run.partial, run.errors[:3]
    assert all(r.ttft is not None for r in run.requests)
    return len(run.requests) / (run.finished - run.started), run.client_bottleneck


def _cpu() -> float:
    """This process's and its reaped children's CPU seconds (the client workers; the server is never reaped)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server-processes", type=int, default=1)
    a = ap.parse_args()
    url, procs = start(a.server_processes)
    try:
        c0 = _cpu()
        base = asyncio.run(_openai_sdk(url, a.requests, a.concurrency))
        base_cpu = a.requests / (_cpu() - c0)
        print(f"openai SDK (baseline)       {base:8.0f} req/s  1.00x   {base_cpu:6.0f} req per client CPU-s  1.00x")
        for w in (1, 2):
            c0 = _cpu()
            rps, flagged = asyncio.run(_ours(url, a.requests, a.concurrency, w))
            per_cpu = a.requests / (_cpu() - c0)
            note = "  (watchdog: client loop lagged)" if flagged else ""
            print(
                f"opengyre bench, {w} worker(s) {rps:8.0f} req/s  {rps / base:.2f}x   {per_cpu:6.0f} req per client CPU-s"
                f"  {per_cpu / base_cpu:.2f}x{note}"
            )
    finally:
        for p in procs:
            p.terminate()


if __name__ == "__main__":
    main()
