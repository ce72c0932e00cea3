"""svc-proxy benchmark: the proxy's added latency, recorded calls per second, tree vs flat storage.

    .venv/bin/python svc-proxy/bench/proxy_bench.py            # everything (a few minutes on 2 cores)
    .venv/bin/python svc-proxy/bench/proxy_bench.py --quick    # fewer calls
    .venv/bin/python svc-proxy/bench/proxy_bench.py --outbox   # only: what the durable outbox costs a call
    .venv/bin/python svc-proxy/bench/proxy_bench.py --clients  # only: our HTTP/1 engine client vs httpx, per route
    .venv/bin/python svc-proxy/bench/proxy_bench.py --cpu      # only: CPU per recorded call, each process's own

Each engine, the gateway and this client run as separate processes (the client's own cost is the same on
both paths, so it cancels out of the ratio but not out of the absolute figures); the gateway records every
call to a real JetStream log. "Direct" sends the same OpenAI chat request to the engine's own
``/v1/chat/completions`` (the engine renders the template itself); "proxy" sends it through the gateway, which
renders, records and forwards token ids to ``/generate``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import msgspec

from opengyre.engine import EngineConfig, EngineProcess
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ModelCallRecorded, default_registry
from opengyre.http1 import Http1Pool
from opengyre.runtime import EmbeddedNats
from opengyre.trajectory import resolve_calls

HERE = Path(__file__).parent
M = "opengyre-tiny"


async def _spawn(args: list[str], port_file: Path, timeout: float = 120) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, *args, "--port-file", str(port_file)], stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not port_file.exists() or not port_file.read_text().strip():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{args[0]} did not start")
        await asyncio.sleep(0.05)
    return proc


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say ok."}]
CHAT = {"model": M, "messages": MSGS, "max_tokens": 16, "temperature": 0}
# The same conversation and budget as a Responses API request (instructions = the system message).
RESPONSES = {"model": M, "instructions": MSGS[0]["content"], "input": MSGS[1]["content"], "max_output_tokens": 16,
             "temperature": 0}  # fmt: skip
ROUTES = {"chat": ("/chat/completions", CHAT), "responses": ("/responses", RESPONSES)}


async def _run(
    c: httpx.AsyncClient, url: str, n: int, conc: int, base: str, body: dict[str, Any] = CHAT
) -> list[float]:
    lat: list[float] = []
    sem = asyncio.Semaphore(conc)

    async def one(i: int) -> None:
        async with sem:
            u = url.format(i=f"{base}-{i}")
            t0 = time.perf_counter()
            r = await c.post(u, json=body)
            lat.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text

    await asyncio.gather(*(one(i) for i in range(n)))
    return lat


def _stats(xs: list[float]) -> tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) * 1e3, xs[int(0.9 * (len(xs) - 1))] * 1e3


async def latency(engine_url: str, proxy_url: str, n: int, label: str, route: str = "chat") -> list[str]:
    """Direct (the engine's own chat route) against the gateway's ``route`` carrying the same conversation."""
    rows = []
    path, body = ROUTES[route]
    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as c:
        direct_url = engine_url + "/v1/chat/completions"
        proxy_tpl = proxy_url + "/x/{i}/v1" + path
        for conc in (1, 64):
            calls = n if conc == 1 else n * 4
            await _run(c, direct_url, 32, conc, "warm")
            await _run(c, proxy_tpl, 32, conc, "warm", body)
            d: list[float] = []
            p: list[float] = []
            for rep in range(3):  # alternate blocks so drift in machine load hits both paths alike
                d += await _run(c, direct_url, calls // 3, conc, f"d{conc}-{rep}")
                p += await _run(c, proxy_tpl, calls // 3, conc, f"p{route}{conc}-{rep}", body)
            (dm, d90), (pm, p90) = _stats(d), _stats(p)
            rows.append(
                f"| {label} | {route} | {conc} | {len(d)} | {dm:.2f} | {pm:.2f} | {pm / dm:.3f} | {pm - dm:+.2f}"
                f" | {d90:.2f} | {p90:.2f} |"
            )
            print(rows[-1], flush=True)
    return rows


async def recorded_rate(nats: str, stream: str, proxy_url: str, n: int) -> str:
    log = await EventLog.connect(
        nats, LogConfig(stream=stream, prefix=f"{stream.lower()}.ev", blob_bucket=f"{stream}_B")
    )
    try:
        before = (await log.js.stream_info(stream)).state.messages
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as c:
            t0 = time.perf_counter()
            await _run(c, proxy_url + "/x/{i}/v1/chat/completions", n, 64, "rate")
            while (await log.js.stream_info(stream)).state.messages - before < n:
                await asyncio.sleep(0.01)
            dt = time.perf_counter() - t0
        return f"| recorded calls/s (fast engine, concurrency 64, {n} calls, all in the log) | {n / dt:.0f} |"
    finally:
        await log.close()


async def tree_vs_flat(nats: str, stream: str, proxy_url: str, calls: int = 100) -> list[str]:
    """One execution whose context grows every call (a tool result of ~200 bytes per turn)."""
    eid = "growing"
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are an agent."}, {"role": "user", "content": "go"}]
    async with httpx.AsyncClient(timeout=120) as c:
        for i in range(calls):
            r = await c.post(
                f"{proxy_url}/x/{eid}/v1/chat/completions", json={"model": M, "messages": msgs, "max_tokens": 16}
            )
            reply = r.json()["choices"][0]["message"]
            msgs += [
                {"role": "assistant", "content": reply["content"] or ""},
                {"role": "user", "content": f"result {i}: " + "x" * 200},
            ]
    log = await EventLog.connect(
        nats, LogConfig(stream=stream, prefix=f"{stream.lower()}.ev", blob_bucket=f"{stream}_B")
    )
    reg = default_registry()
    try:
        while True:
            events = [s async for s in log.read(subjects=log.config.instance_filters("execution", eid))]
            if len(events) >= calls:
                break
            await asyncio.sleep(0.05)
        stored = [reg.decode(s.type_name, s.version, s.body) for s in events]
        assert all(isinstance(e, ModelCallRecorded) for e in stored)
        # As recorded now: events with references, each call's payload stored once (storage.md).
        now_bytes = sum(len(s.body) for s in events) + sum(e.payload.size for e in stored if e.payload)  # type: ignore[attr-defined]
        decoded = await resolve_calls(log, stored)  # type: ignore[arg-type]
    finally:
        await log.close()
    # Tree and flat compared in one encoding: the event's JSON with the tokens and context inline.
    tree_bytes = sum(len(reg.encode(msgspec.structs.replace(e, payload=None))) for e in decoded)
    prompts: dict[str, list[int]] = {}
    convs: dict[str, list[Any]] = {}
    flat_bytes = tree_tokens = flat_tokens = 0
    for e in decoded:
        assert isinstance(e, ModelCallRecorded)
        parent = e.parent_call_id
        prompt = (prompts[parent][: e.prefix_len] if parent else []) + list(e.prompt_delta_ids)
        ctx = e.context or {}
        conv = (convs[parent][: ctx.get("base", 0)] if parent else []) + list(ctx.get("messages", []))
        prompts[e.call_id] = prompt + list(e.output_ids)
        convs[e.call_id] = [*conv, ctx.get("response")]
        flat = msgspec.structs.replace(
            e,
            parent_call_id=None,
            prefix_len=0,
            prompt_delta_ids=prompt,
            context={**ctx, "base": 0, "messages": conv},
            payload=None,
        )
        flat_bytes += len(reg.encode(flat))
        tree_tokens += len(e.prompt_delta_ids) + len(e.output_ids)
        flat_tokens += len(prompt) + len(e.output_ids)
    branches = sorted({e.branch for e in decoded if isinstance(e, ModelCallRecorded)})
    return [
        f"| {calls}-call execution, event bytes (tokens + context) | {tree_bytes:,} | {flat_bytes:,} | {flat_bytes / tree_bytes:.1f}x |",
        f"| {calls}-call execution, tokens stored | {tree_tokens:,} | {flat_tokens:,} | {flat_tokens / tree_tokens:.1f}x |",
        f"| {calls}-call execution, stored now (events + payloads, storage.md) | {now_bytes:,} | | |",
        f"(branches seen: {', '.join(branches)})",
    ]


async def outbox_cost(n: int) -> None:
    """The same gateway three times, its outbox in memory, in a file, in an fsync'd file (the default), in
    front of the fast stand-in.

    Calls go to the three in alternating blocks (load drift hits all alike); the figures are each file outbox's
    median over the memory outbox's. The memory outbox runs the same code (SQLite in memory), so the difference
    is the file, and then its fsync on each call's path (shared by the calls committed together).
    """
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs.append(await _spawn([str(HERE / "fast_engine.py"), "--tokens", "16"], t / "fast.url"))
            engine = (t / "fast.url").read_text().strip()
            urls = {}
            variants: tuple[tuple[str, list[str]], ...] = (
                ("memory", []),
                ("file", ["--outbox", str(t / "nosync.sqlite3"), "--no-fsync"]),
                ("fsync", ["--outbox", str(t / "outbox.sqlite3")]),
            )
            for name, extra in variants:
                cmd = [str(HERE / "proxy_server.py"), "--nats", url, "--engine", engine, "--stream", name.upper()]
                procs.append(await _spawn([*cmd, *extra], t / f"{name}.url"))
                urls[name] = (t / f"{name}.url").read_text().strip() + "/x/{i}/v1/chat/completions"
            print("| concurrency | calls per path | outbox | median ms | ratio to memory | added ms | p90 ms |")
            print("| --- | --- | --- | --- | --- | --- | --- |")
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as c:
                for conc in (1, 64):
                    calls = n if conc == 1 else n * 4
                    for name in urls:
                        await _run(c, urls[name], 32, conc, f"warm-{name}")
                    lat: dict[str, list[float]] = {name: [] for name in urls}
                    for rep in range(3):
                        for name in urls:
                            lat[name] += await _run(c, urls[name], calls // 3, conc, f"{name}{conc}-{rep}")
                    base, _ = _stats(lat["memory"])
                    for name in urls:
                        med, p90 = _stats(lat[name])
                        print(
                            f"| {conc} | {len(lat[name])} | {name} | {med:.2f} | {med / base:.3f} | {med - base:+.2f}"
                            f" | {p90:.2f} |",
                            flush=True,
                        )
        finally:
            for p in procs:
                _stop(p)
            nats.stop()


async def client_cost(n: int) -> None:
    """The gateway twice in front of the fast stand-in, its engine client our HTTP/1 one or httpx (same load,
    same read timeout), on the chat and Responses routes; the engine's own chat route is the baseline.

    Blocks alternate between direct, http1 and httpx so load drift hits all alike; the ratio is httpx over
    http1 (above 1: httpx is slower), the added figures are each gateway's median over direct.
    """
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            procs.append(await _spawn([str(HERE / "fast_engine.py"), "--tokens", "16"], t / "fast.url"))
            engine = (t / "fast.url").read_text().strip()
            gateways = {}
            for name in ("http1", "httpx"):
                cmd = [str(HERE / "proxy_server.py"), "--nats", url, "--engine", engine, "--stream", name.upper()]
                procs.append(await _spawn([*cmd, "--engine-transport", name], t / f"{name}.url"))
                gateways[name] = (t / f"{name}.url").read_text().strip()
            print(
                "| route | concurrency | calls per path | direct median ms | http1 median ms | httpx median ms"
                " | httpx / http1 | http1 added ms | httpx added ms | http1 p90 | httpx p90 |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=256)) as c:
                for route, (path, body) in ROUTES.items():
                    for conc in (1, 64):
                        calls = n if conc == 1 else n * 4
                        urls = {"direct": engine + "/v1/chat/completions"}
                        urls.update({k: v + "/x/{i}/v1" + path for k, v in gateways.items()})
                        bodies = {"direct": CHAT, "http1": body, "httpx": body}
                        for k in urls:
                            await _run(c, urls[k], 32, conc, f"warm-{k}", bodies[k])
                        lat: dict[str, list[float]] = {k: [] for k in urls}
                        for rep in range(3):
                            for k in urls:
                                lat[k] += await _run(c, urls[k], calls // 3, conc, f"{k}{route}{conc}-{rep}", bodies[k])
                        (dm, _), (am, a90), (bm, b90) = (
                            _stats(lat["direct"]),
                            _stats(lat["http1"]),
                            _stats(lat["httpx"]),
                        )
                        print(
                            f"| {route} | {conc} | {len(lat['direct'])} | {dm:.2f} | {am:.2f} | {bm:.2f} | {bm / am:.3f}"
                            f" | {am - dm:+.2f} | {bm - dm:+.2f} | {a90:.2f} | {b90:.2f} |",
                            flush=True,
                        )
        finally:
            for p in procs:
                _stop(p)
            nats.stop()


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, every thread), from /proc: what its work cost, whatever the
    machine's load (a wall-clock rate on 2 shared cores is mostly the load)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _lean_run(pool: Http1Pool, path: str, body: bytes, n: int, conc: int, base: str) -> list[float]:
    """``n`` calls at ``conc``, each to its own execution, with the lean HTTP/1 client (httpx would cost the
    client more CPU than the gateway, on the same 2 cores)."""
    lat: list[float] = []
    it = iter(range(n))

    async def worker() -> None:
        for i in it:
            t0 = time.perf_counter()
            r = await pool.request("POST", path.format(i=f"{base}-{i}"), body, {"content-type": "application/json"})
            data = await r.read()
            lat.append(time.perf_counter() - t0)
            assert r.status == 200, data[:300]

    await asyncio.gather(*(worker() for _ in range(conc)))
    return lat


async def cpu_cost(n: int, profile: Path | None, concurrencies: tuple[int, ...] = (1, 16, 64)) -> None:
    """CPU per recorded call, each process's own (the gateway, the engine stand-in, nats-server), at concurrency 1,
    16 and 64: chat calls through the gateway (in-memory outbox, as the main table) until all are in the log; the
    same calls sent straight to the stand-in's ``/generate`` in the same run are the baseline the gateway's CPU is
    put over. ``profile``: the gateway runs under py-spy, its samples written there (collapsed stacks: speedscope and flamegraph.pl read them)."""
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        procs: list[subprocess.Popen[bytes]] = []
        log: EventLog | None = None
        try:
            fast = await _spawn([str(HERE / "fast_engine.py"), "--tokens", "16"], t / "fast.url")
            procs.append(fast)
            engine = (t / "fast.url").read_text().strip()
            cmd = [str(HERE / "proxy_server.py"), "--nats", url, "--engine", engine, "--stream", "CPU"]
            if profile is not None:
                spy = [str(Path(sys.executable).parent / "py-spy"), "record", "-r", "250", "-f", "raw"]
                cmd = [*spy, "-o", str(profile), "--", sys.executable, *cmd]
                proc = subprocess.Popen([*cmd, "--port-file", str(t / "proxy.url")], stdin=subprocess.DEVNULL)
                while not (t / "proxy.url").exists() or not (t / "proxy.url").read_text().strip():
                    await asyncio.sleep(0.05)
                gw = proc
            else:
                gw = await _spawn(cmd, t / "proxy.url")
            procs.append(gw)
            gw_pid = gw.pid
            if profile is not None:  # py-spy's child is the gateway
                kids = Path(f"/proc/{gw.pid}/task/{gw.pid}/children").read_text().split()
                gw_pid = int(kids[0])
            proxy = (t / "proxy.url").read_text().strip()
            log = await EventLog.connect(url, LogConfig(stream="CPU", prefix="cpu.ev", blob_bucket="CPU_B"))
            assert nats.proc is not None
            nats_pid = nats.proc.pid
            gen = msgspec.json.encode(
                {"input_ids": list(range(40)), "sampling_params": {"max_new_tokens": 16, "temperature": 0},
                 "return_logprob": True}
            )  # fmt: skip
            chat = msgspec.json.encode(CHAT)
            gpool, dpool = Http1Pool(proxy, max_idle=256), Http1Pool(engine, max_idle=256)
            print(f"load average before: {os.getloadavg()[0]:.2f}")
            print(
                "| concurrency | calls | gateway CPU ms/call | engine CPU ms/call (via gateway) | nats CPU ms/call"
                " | direct /generate: engine CPU ms/call | gateway / engine-direct CPU | recorded calls/s"
                " | median ms (proxy) | median ms (direct) | added ms | load avg |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            await _lean_run(gpool, "/x/{i}/v1/chat/completions", chat, 64, 8, "warm")
            await _lean_run(dpool, "/generate", gen, 64, 8, "warm")
            for conc in concurrencies:
                calls = n if conc == 1 else n * 4
                before = (await log.js.stream_info("CPU")).state.messages
                g0, e0, n0, t0 = _cpu_s(gw_pid), _cpu_s(fast.pid), _cpu_s(nats_pid), time.perf_counter()
                lat = await _lean_run(gpool, "/x/{i}/v1/chat/completions", chat, calls, conc, f"c{conc}")
                while (await log.js.stream_info("CPU")).state.messages - before < calls:
                    await asyncio.sleep(0.005)
                dt = time.perf_counter() - t0
                g1, e1, n1 = _cpu_s(gw_pid), _cpu_s(fast.pid), _cpu_s(nats_pid)
                d0 = _cpu_s(fast.pid)
                dlat = await _lean_run(dpool, "/generate", gen, calls, conc, f"d{conc}")
                d1 = _cpu_s(fast.pid)
                g, e, nn, d = ((b - a) * 1e3 / calls for a, b in ((g0, g1), (e0, e1), (n0, n1), (d0, d1)))
                pm, dm = statistics.median(lat) * 1e3, statistics.median(dlat) * 1e3
                print(
                    f"| {conc} | {calls} | {g:.3f} | {e:.3f} | {nn:.3f} | {d:.3f} | {g / d:.2f} | {calls / dt:.0f}"
                    f" | {pm:.2f} | {dm:.2f} | {pm - dm:+.2f} | {os.getloadavg()[0]:.2f} |",
                    flush=True,
                )
            await gpool.close()
            await dpool.close()
        finally:
            if log is not None:
                await log.close()
            if profile is not None and len(procs) == 2:  # py-spy writes its profile when interrupted
                procs.pop().send_signal(signal.SIGINT)
                await asyncio.to_thread(gw.wait, 120)
            for p in procs:
                _stop(p)
            nats.stop()


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--outbox", action="store_true", help="only compare a durable outbox with one in memory")
    ap.add_argument("--clients", action="store_true", help="only compare the gateway's HTTP/1 engine client with httpx")
    ap.add_argument("--cpu", action="store_true", help="only: CPU per recorded call of each process")
    ap.add_argument("--profile", type=Path, help="with --cpu: run the gateway under py-spy, collapsed stacks here")
    ap.add_argument("--concurrency", default="1,16,64", help="with --cpu: the concurrencies to measure")
    args = ap.parse_args()
    n = 60 if args.quick else 300
    if args.cpu:
        await cpu_cost(n, args.profile, tuple(int(c) for c in args.concurrency.split(",")))
        return
    if args.outbox:
        await outbox_cost(n)
        return
    if args.clients:
        await client_cost(n)
        return
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            lat_rows: list[str] = []
            fast = await _spawn([str(HERE / "fast_engine.py"), "--tokens", "16"], t / "fast.url")
            procs.append(fast)
            fast_url = (t / "fast.url").read_text().strip()
            proxy = await _spawn(
                [str(HERE / "proxy_server.py"), "--nats", url, "--engine", fast_url, "--stream", "FAST"],
                t / "proxy.url",
            )
            procs.append(proxy)
            proxy_url = (t / "proxy.url").read_text().strip()
            print(
                "| engine | route | concurrency | calls | direct median ms | proxy median ms | ratio | added ms"
                " | direct p90 | proxy p90 |"
            )
            print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
            lat_rows += await latency(fast_url, proxy_url, n, "fast (stand-in for SGLang)")
            lat_rows += await latency(fast_url, proxy_url, n, "fast (stand-in for SGLang)", "responses")
            rate = await recorded_rate(url, "FAST", proxy_url, n * 4)
            growth = await tree_vs_flat(url, "FAST", proxy_url)
            for p in procs:
                _stop(p)
            procs.clear()
            async with EngineProcess(EngineConfig(port=0, threads=1)) as cpu:
                proxy = await _spawn(
                    [str(HERE / "proxy_server.py"), "--nats", url, "--engine", cpu.url, "--stream", "CPU"],
                    t / "proxy2.url",
                )
                procs.append(proxy)
                lat_rows += await latency(cpu.url, (t / "proxy2.url").read_text().strip(), n // 2, "CPU engine (tiny)")
            print()
            print("| figure | value |\n| --- | --- |")
            print(rate)
            print()
            print("| storage | tree | flat | flat / tree |\n| --- | --- | --- | --- |")
            for row in growth:
                print(row)
            print(json.dumps({"latency": lat_rows, "rate": rate, "growth": growth}), file=sys.stderr)
        finally:
            for p in procs:
                _stop(p)
            nats.stop()


if __name__ == "__main__":
    asyncio.run(main())
