"""How many short streamed requests per second the load generator can sustain: its own CPU per request, measured
against a server that costs next to nothing, and the capacity that CPU cost leaves on two free cores.

    .venv/bin/python svc-bench/bench/client_capacity.py                  # 20,000 requests per client
    .venv/bin/python svc-bench/bench/client_capacity.py --requests 3000  # a quick look
    .venv/bin/python svc-bench/bench/client_capacity.py --locust /tmp/venv-locust/bin/locust

Same server (``_fast_server.py``), same work (single-turn sessions, one streamed chat completion each, one user
message, ``max_tokens`` 1, C in flight), one client after the other in one run: the ``openai`` SDK (AsyncOpenAI,
streaming: what many harnesses and benchmark scripts drive) as the baseline, ours with 1 and 2 worker
processes, and, with ``--locust``, Locust (an established load tester from PyPI, in a virtual environment of its
own: it is not one of the project's dependencies) with 1 and 2 processes.

Per client: requests/s (wall: depends on what else the machine runs, so the load average is printed), the
client's CPU-seconds per request (its process and every process it reaped: our workers, Locust), and the
server's (read from /proc for the server processes, which are never reaped). On a shared machine the CPU figure
is the honest one: the capacity on two free cores is 2 / (client CPU-s per request), and, with the server on the
same two cores, 2 / (client + server CPU-s per request).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import openai
from _fast_server import start  # type: ignore[import-not-found]  # the folder beside, put on sys.path above

from opengyre.bench import LoadConfig, SessionPlan, TurnPlan, run_load

HERE = Path(__file__).parent
Probe = Callable[[], tuple[int, float, str]]  # runs a client: (requests completed, wall seconds, a note)
TOKENIZER = HERE.parents[1] / "libs" / "opengyre" / "models" / "assets" / "byte-chatml"


@dataclass
class Row:
    client: str
    requests: int
    wall_s: float
    client_cpu_s: float
    server_cpu_s: float
    note: str = ""

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s

    @property
    def client_ms(self) -> float:
        return self.client_cpu_s / self.requests * 1e3

    @property
    def server_ms(self) -> float:
        return self.server_cpu_s / self.requests * 1e3


def _plans(n: int) -> list[SessionPlan]:
    return [SessionPlan(f"s{i}", (TurnPlan(({"role": "user", "content": "hi"},), 1),)) for i in range(n)]


async def _openai_sdk(url: str, n: int, c: int) -> tuple[int, float, str]:
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
    return n, dur, ""


async def _ours(url: str, n: int, c: int, workers: int) -> tuple[int, float, str]:
    run = await run_load(LoadConfig(url, "m", concurrency=c, workers=workers, ignore_eos=False), _plans(n))
    assert not run.partial, run.errors[:3]
    assert all(r.ttft is not None for r in run.requests)
    own = run.client_cpu_s / len(run.requests) * 1e3
    note = f"own CPU while sending {own:.3f} ms/req (no start-up); watchdog: loop lateness p99 "
    note += f"{run.loop_lag_p99_s * 1e3:.0f} ms" + (" (flagged: client-bound)" if run.client_bottleneck else "")
    return len(run.requests), run.finished - run.started, note


def _guidellm(exe: str, tokenizer: str, url: str, c: int, n: int) -> tuple[int, float, str]:
    """GuideLLM (vLLM project's benchmark client) with the same request: chat completions, streamed, one user
    message, one output token. Its tokenizer is a local folder: the synthetic prompts need one, and the hub
    cannot be reached here."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "g.json"
        argv = [exe, "run", "--backend", f"kind=openai_http,target={url},model=m"]
        argv += ["--profile", f"kind=concurrent,streams={c}", "--constraint", f"kind=max_requests,count={n}"]
        argv += ["--tokenizer", f"kind=huggingface_auto,model={tokenizer}"]
        argv += ["--data", "kind=synthetic_text,prompt_tokens=1,output_tokens=1"]
        argv += ["--output", f"kind=json,path={out}", "--disable-console"]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
        if not out.exists():
            raise SystemExit(f"guidellm wrote no results: {done.stderr[-800:]}")
        b = json.loads(out.read_text())["benchmarks"][0]
    totals, m = b["metrics"]["request_totals"], b["scheduler_metrics"]
    if totals["errored"]:
        raise SystemExit(f"guidellm: {totals['errored']} of {n} requests failed")
    # its report sometimes holds a few requests fewer than it was asked for (none errored): what it reports counts
    return int(totals["successful"]), m["request_end_time"] - m["request_start_time"], ""


def _marginal(name: str, pids: list[int], small: Probe, big: Probe) -> Row:
    """A tool that starts processes and imports much (Locust, GuideLLM) spends CPU before its first request: a
    short run and a long one, and the difference in CPU over the difference in requests, is what one request
    costs it once running (the long run's wall rate is kept)."""
    a, b = _measure(name, pids, small, quiet=True), _measure(name, pids, big, quiet=True)
    dn = b.requests - a.requests
    row = Row(name, dn, b.wall_s * dn / b.requests, b.client_cpu_s - a.client_cpu_s, b.server_cpu_s - a.server_cpu_s)
    row.note = f"marginal: ({b.requests} - {a.requests}) requests; with start-up {b.client_ms:.3f} ms CPU/req"
    _print(row)
    return row


def _ours_sync(url: str, n: int, c: int, workers: int) -> tuple[int, float, str]:
    return asyncio.run(_ours(url, n, c, workers))


def _locust(exe: str, url: str, c: int, seconds: float, processes: int) -> tuple[int, float, str]:
    """Locust runs for a time, not a count: its own statistics give how many requests it completed and over
    which span (first request's start to the last one's)."""
    argv = [exe, "-f", str(HERE / "_locustfile.py"), "--headless", "-u", str(c), "-r", str(c)]
    argv += ["-t", f"{seconds:g}s", "--host", url, "--json", "--only-summary", "--loglevel", "WARNING"]
    if processes > 1:
        argv += ["--processes", str(processes)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=HERE)
    # with --processes every forked worker prints its (empty) list too: the master's holds the totals
    docs, text, at = [], done.stdout, 0
    while (at := _skip_space(text, at)) < len(text):
        doc, at = json.JSONDecoder().raw_decode(text, at)
        docs.append(doc)
    rows = [s for d in docs for s in d if s["name"] == "/v1/chat/completions"]
    if not rows:
        raise SystemExit(f"locust printed no statistics: {done.stderr[-800:]}")
    row = max(rows, key=lambda s: int(s["num_requests"]))
    if row["num_failures"]:
        raise SystemExit(f"locust: {row['num_failures']} failed requests: {done.stderr[-500:]}")
    span = row["last_request_timestamp"] - row["start_time"]
    return int(row["num_requests"]), span, "runs for a time; includes its start-up CPU"


def _skip_space(text: str, at: int) -> int:
    while at < len(text) and text[at].isspace():
        at += 1
    return at


def _cpu() -> float:
    """This process's and its reaped children's CPU seconds (our workers, Locust; the server is never reaped)."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _server_cpu(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def _measure(name: str, pids: list[int], fn: Probe, quiet: bool = False) -> Row:
    c0, s0 = _cpu(), _server_cpu(pids)
    n, wall, note = fn()
    row = Row(name, n, wall, _cpu() - c0, _server_cpu(pids) - s0, note)
    if not quiet:
        _print(row)
    return row


def _print(row: Row) -> None:
    print(
        f"{row.client:<26} {row.requests:6d} req {row.rps:7.0f} req/s   client {row.client_ms:.3f} ms CPU/req "
        f"(2 free cores: {2e3 / row.client_ms:6.0f} req/s)   server {row.server_ms:.3f} ms CPU/req   "
        f"client+server on 2 cores: {2e3 / (row.client_ms + row.server_ms):6.0f} req/s   {row.note}",
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--server-processes", type=int, default=1)
    ap.add_argument("--locust", help="path to a locust executable (its own venv): run it on the same server too")
    ap.add_argument("--locust-seconds", type=float, default=20.0)
    ap.add_argument("--guidellm", help="path to a guidellm executable (its own venv): run it on the same server too")
    ap.add_argument("--tokenizer", default=str(TOKENIZER), help="a local tokenizer folder for GuideLLM")
    ap.add_argument("--sdk-requests", type=int, default=3000, help="the SDK's share (its CPU per request is ~4 ms)")
    ap.add_argument("--skip-sdk", action="store_true", help="leave the openai SDK out (it is slow on a busy box)")
    a = ap.parse_args()
    url, procs = start(a.server_processes)
    pids = [p.pid for p in procs]
    print(f"server {url} ({a.server_processes} process(es)); C={a.concurrency}; load average {os.getloadavg()}")
    n, c = a.requests, a.concurrency
    try:
        rows = []
        if not a.skip_sdk:
            k = min(n, a.sdk_requests)
            rows.append(_measure("openai SDK (baseline)", pids, lambda: asyncio.run(_openai_sdk(url, k, c))))
        for w in (1, 2):
            rows.append(_measure(f"opengyre bench, {w} worker(s)", pids, functools.partial(_ours_sync, url, n, c, w)))
        if a.locust:
            for p in (1, 2):
                short = functools.partial(_locust, a.locust, url, c, a.locust_seconds / 4, p)
                long = functools.partial(_locust, a.locust, url, c, a.locust_seconds, p)
                rows.append(_marginal(f"locust, {p} process(es)", pids, short, long))
        if a.guidellm:
            small = functools.partial(_guidellm, a.guidellm, a.tokenizer, url, c, max(c * 4, n // 10))
            big = functools.partial(_guidellm, a.guidellm, a.tokenizer, url, c, n)
            rows.append(_marginal("guidellm", pids, small, big))
        base = rows[0]
        for r in rows[1:]:
            print(
                f"  {r.client} vs {base.client}: {base.client_ms / r.client_ms:.2f}x less client CPU per request, "
                f"{r.rps / base.rps:.2f}x the requests/s"
            )
        print(f"load average after: {os.getloadavg()}")
    finally:
        for p in procs:
            p.terminate()


if __name__ == "__main__":
    main()
