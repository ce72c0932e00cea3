"""What moving an execution and switching a cell cost on what is built: the CPU engine and the local actuator.

Per model and context length, on two real CPU engines in this process (one torch thread, so CPU seconds are the
work): **re-prefill** (the new engine computes the whole context: what the proxy's ``RePrefill`` leaves it to do)
against **KV migration** (``/og/kv/export`` from the old engine, ``/og/kv/import`` into the new, then the same
continuation, which computes one position). Both end with the same one-token generation on the new engine, and the
engine's own ``prefill_tokens`` counter says how many positions each computed. In the same process: the machine's
dense GEMM rate and tensor-copy bandwidth, the baselines the simulator's scaling rule keeps ratios against
(``opengyre.scheduler.sim.MeasuredMoves``).

Then a cell's switch as the scheduler's local actuator performs it: rollout -> training (drain, stop the engine
process, start the trainer worker until it is ready) and back (stop the worker, start an engine process until it
serves). The worker connects to a bare gRPC server here (it is ready once connected; it claims nothing).

Run: .venv/bin/python svc-scheduler/bench/move_costs.py [--models tiny,small,smollm2-135m@4096 (name@N: contexts
     up to N only)] [--contexts 1024,4096,16384]
     [--reps 3] [--switch-reps 3] [--out svc-scheduler/opengyre/scheduler/sim/measurements/cpu-engine.toml]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import tomli_w
import torch

from opengyre.engine import KV_MEDIA_TYPE, EngineConfig, EngineServer
from opengyre.scheduler import CellState
from opengyre.scheduler.actuators import LocalActuator
from opengyre.scheduler.sim import ModelFacts

torch.set_num_threads(1)


def cpu() -> float:
    return time.process_time()


def gemm_flops(reps: int = 5, n: int = 1024) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(reps):
        t = cpu()
        torch.mm(a, b)
        best = min(best, cpu() - t)
    return 2 * n**3 / best


def copy_bytes_per_s(reps: int = 5, mib: int = 256) -> float:
    x = torch.empty(mib * 2**20 // 4)
    x.fill_(1.0)
    best = float("inf")
    for _ in range(reps):
        t = cpu()
        x.clone()
        best = min(best, cpu() - t)
    return x.numel() * 4 / best


def facts(srv: EngineServer) -> ModelFacts:
    """The served model in the simulator's terms: its prefill FLOPs are the same formula the simulator charges."""
    cfg = srv.engine.model.config
    r = srv.engine.runner
    layer_params = sum(p.numel() for p in srv.engine.model.model.layers.parameters())
    return ModelFacts(
        name=srv.config.model_name,
        params_b=sum(p.numel() for p in srv.engine.model.parameters()) / 1e9,
        active_params_b=layer_params / 1e9,  # the per-token GEMMs of a prefill (its logits: the last position only)
        attention_layers=r.n_layers,
        attention_width=r.n_heads * r.head_dim,
        kv_bytes_per_token=2.0 * r.n_layers * r.kv_heads * r.head_dim * r.dtype.itemsize,
        context_tokens=float(cfg.max_position_embeddings),
        trained_tokens=1.0,
    )


async def timed(fn: Any) -> tuple[Any, float, float]:
    c0, w0 = cpu(), time.perf_counter()
    out = await fn()
    return out, cpu() - c0, time.perf_counter() - w0


async def generate(c: httpx.AsyncClient, url: str, ids: list[int]) -> dict[str, Any]:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    r = await c.post(url + "/generate", json=body)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


async def move(c: httpx.AsyncClient, src: str, dst: str, ids: list[int]) -> tuple[float, float, int]:
    """Export the context's KV from ``src``, import it into ``dst``, continue there: (export, import) CPU-s, bytes."""
    t0 = cpu()
    r = await c.post(src + "/og/kv/export", json={"input_ids": ids})
    r.raise_for_status()
    t1 = cpu()
    got = await c.post(dst + "/og/kv/import", content=r.content, headers={"content-type": KV_MEDIA_TYPE})
    got.raise_for_status()
    t2 = cpu()
    await generate(c, dst, ids)
    return t1 - t0, t2 - t1, len(r.content)


async def measure_model(preset: str, contexts: list[int], reps: int) -> tuple[ModelFacts, list[dict[str, Any]]]:
    cfg = EngineConfig(port=0, preset=preset, threads=1, prefill_chunk=1024)
    points = []
    async with EngineServer(cfg) as a, EngineServer(cfg) as b, httpx.AsyncClient(timeout=3600) as c:
        mf = facts(a)
        for srv in (a, b):  # the identity's weights digest is computed once per engine and weights, not per move
            await asyncio.wrap_future(srv.engine.scheduler.call(srv.engine.weights_sha256))
        rng = np.random.default_rng(0)
        for n in contexts:
            ids = [int(t) for t in rng.integers(0, a.engine.vocab_size, n + 1)]
            await generate(c, a.url, ids[:n])  # A holds the context's n positions in its prefix cache
            rows: dict[str, list[float]] = {k: [] for k in ("re_cpu", "re_wall", "kv_cpu", "kv_wall", "exp", "imp")}
            blob_bytes, computed = 0, {}
            for _ in range(reps):
                await c.post(b.url + "/flush_cache")
                p0 = b.engine.scheduler.prefill_tokens
                _, tc, tw = await timed(partial(generate, c, b.url, ids))
                computed["re-prefill"] = b.engine.scheduler.prefill_tokens - p0
                rows["re_cpu"].append(tc)
                rows["re_wall"].append(tw)
                await c.post(b.url + "/flush_cache")
                p0 = b.engine.scheduler.prefill_tokens
                (exp, imp, blob_bytes), tc, tw = await timed(partial(move, c, a.url, b.url, ids))
                computed["kv"] = b.engine.scheduler.prefill_tokens - p0
                rows["kv_cpu"].append(tc)
                rows["kv_wall"].append(tw)
                rows["exp"].append(exp)
                rows["imp"].append(imp)
            med = {k: statistics.median(v) for k, v in rows.items()}
            point = {
                "model": preset,
                "tokens": n,
                "bytes": blob_bytes,
                "prefill_flops": mf.prefill_flops(n + 1),
                "re_prefill_cpu_s": med["re_cpu"],
                "kv_cpu_s": med["kv_cpu"],
                "export_cpu_s": med["exp"],
                "import_cpu_s": med["imp"],
                "re_prefill_wall_s": med["re_wall"],
                "kv_wall_s": med["kv_wall"],
                "re_prefill_computed": computed["re-prefill"],
                "kv_computed": computed["kv"],
            }
            points.append(point)
            print(
                f"{preset:13s} {n:6d} tokens: re-prefill {med['re_cpu']:8.3f} CPU-s ({computed['re-prefill']} "
                f"positions computed) | KV move {med['kv_cpu']:7.3f} CPU-s (export {med['exp']:.3f}, import "
                f"{med['imp']:.3f}; {blob_bytes / 2**20:.1f} MiB; {computed['kv']} computed) | KV / re-prefill "
                f"{med['kv_cpu'] / med['re_cpu']:.4f} | wall {med['re_wall']:.2f} / {med['kv_wall']:.2f} s",
                flush=True,
            )
    return mf, points


class _Bare:
    """A gRPC server with no services: a trainer worker is ready once its channel to it is up."""

    async def __aenter__(self) -> str:
        self.server = grpc.aio.server()
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)


def children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


async def measure_switch(reps: int) -> list[dict[str, float]]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="move-costs-") as d:
        async with _Bare() as addr:
            act = LocalActuator(Path(d), scheduler_addr=addr, start_timeout=600)
            cell = CellState(cell_id="c0", node="local", gpus=0, capacity=1, role="rollout", engine_url=None,
                             resident=False, order=0, role_seq=0, role_since=0.0)  # fmt: skip
            try:
                cell.engine_url = await act.start_engine(cell)
                for _ in range(reps):
                    c0, w0 = children_cpu(), time.perf_counter()
                    await act.drain(cell)
                    await act.release_engine(cell)
                    w1 = time.perf_counter()
                    await act.start_trainer(cell, core=True)
                    w2 = time.perf_counter()
                    await act.stop_trainer(cell)
                    w3 = time.perf_counter()
                    cell.engine_url = await act.start_engine(cell)
                    w4 = time.perf_counter()
                    rows.append(
                        {
                            "engine_stop_s": w1 - w0,
                            "trainer_start_s": w2 - w1,
                            "to_training_s": w2 - w0,
                            "trainer_stop_s": w3 - w2,
                            "engine_start_s": w4 - w3,
                            "to_rollout_s": w4 - w2,
                            "children_cpu_s": children_cpu() - c0,
                        }
                    )
                    r = rows[-1]
                    print(
                        f"switch: to training {r['to_training_s']:.2f} s (engine stop {r['engine_stop_s']:.2f}, "
                        f"worker start {r['trainer_start_s']:.2f}) | back {r['to_rollout_s']:.2f} s (worker stop "
                        f"{r['trainer_stop_s']:.2f}, engine start {r['engine_start_s']:.2f}) | children "
                        f"{r['children_cpu_s']:.2f} CPU-s (the engine's and the worker's that exited)",
                        flush=True,
                    )
            finally:
                await act.close()
    return rows


def fit_kv(points: list[dict[str, Any]]) -> tuple[float, float]:
    """KV move CPU-s = latency + bytes / rate, least squares over the context lengths: (latency, rate)."""
    x = np.array([p["bytes"] for p in points], dtype=float)
    y = np.array([p["kv_cpu_s"] for p in points], dtype=float)
    slope, intercept = np.polyfit(x, y, 1) if len(points) > 1 else (y[0] / x[0], 0.0)
    return max(float(intercept), 0.0), 1.0 / float(slope)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,small")
    ap.add_argument("--contexts", default="1024,4096,16384")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--switch-reps", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write the measurement file the simulator reads (sim.load_measured)")
    ap.add_argument("--from-model", help="the model whose efficiencies go in --out (default: the largest measured)")
    args = ap.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    load = os.getloadavg()[0]
    print(f"commit {commit}, load average {load:.1f}, 1 torch thread; CPU seconds of this process", flush=True)
    g, cp = gemm_flops(), copy_bytes_per_s()
    print(f"machine: dense float32 GEMM {g / 1e9:.2f} GFLOP/s, tensor copy {cp / 1e9:.2f} GB/s", flush=True)
    contexts = [int(x) for x in args.contexts.split(",")]
    by_model: dict[str, tuple[ModelFacts, list[dict[str, Any]]]] = {}
    for spec in args.models.split(","):
        preset, _, cap = spec.partition("@")  # name@N: only the contexts up to N tokens for this model
        mine = [n for n in contexts if not cap or n <= int(cap)]
        by_model[preset] = asyncio.run(measure_model(preset, mine, args.reps))
    summary: dict[str, dict[str, float]] = {}
    for preset, (mf, pts) in by_model.items():
        eff = sum(p["prefill_flops"] for p in pts) / sum(p["re_prefill_cpu_s"] for p in pts) / g
        lat, rate = fit_kv(pts)
        summary[preset] = {"prefill_efficiency": eff, "kv_latency_s": lat, "kv_rate": rate, "kv_eff": rate / cp}
        print(
            f"{preset}: prefill at {eff:.1%} of the GEMM rate ({mf.prefill_flops(1) / 1e6:.2f} MFLOP per token + "
            f"attention); KV move = {lat * 1e3:.1f} ms + bytes at {rate / 1e9:.2f} GB/s ({rate / cp:.1%} of the "
            f"copy bandwidth); {mf.kv_bytes_per_token:.0f} KV bytes per token; KV / re-prefill "
            + ", ".join(f"{p['tokens']}: {p['kv_cpu_s'] / p['re_prefill_cpu_s']:.4f}" for p in pts),
            flush=True,
        )
    switch = asyncio.run(measure_switch(args.switch_reps)) if args.switch_reps else []
    if switch:
        to_t = statistics.median(r["to_training_s"] for r in switch)
        to_r = statistics.median(r["to_rollout_s"] for r in switch)
        print(f"switch (median of {len(switch)}, wall at load {load:.1f}): to training {to_t:.2f} s, back "
              f"{to_r:.2f} s; QwenGyre's measured 8.52 s / 3.46 s: ratio {to_t / 8.52:.2f} / {to_r / 3.46:.2f}")  # fmt: skip
    if args.out:
        src = args.from_model or max(by_model, key=lambda k: by_model[k][0].params_b)
        s = summary[src]
        doc = {
            "measured": {
                "source": f"svc-scheduler/bench/move_costs.py --models {args.models} --contexts {args.contexts} "
                f"--reps {args.reps} at {commit}, load average {load:.1f}, 1 torch thread",
                "model": src,
                "gemm_flops": g,
                "copy_bytes_per_s": cp,
                "prefill_efficiency": min(s["prefill_efficiency"], 1.0),
                "kv_link_efficiency": min(s["kv_eff"], 1.0),
                "kv_latency_s": s["kv_latency_s"],
                "points": [p for _, pts in by_model.values() for p in pts],
                "switches": switch,
            }
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(tomli_w.dumps(doc))
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
