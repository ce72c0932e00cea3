"""The CPU engine's prefill and decode throughput on a real model against transformers' ``generate``, in one process.

Same weights (two copies of the model in one process), same prompts (chat prompts rendered by the model's
template), greedy, the same number of new tokens (eos ignored on both sides so every request decodes the same
length), the same torch thread count. For each batch size, each side runs twice per repeat, interleaved with the
other: with 1 new token (prefill + the first token) and with ``--new`` tokens; prefill tokens/s = prompt tokens
over the first run, decode tokens/s = the further tokens over the difference. Best of the repeats, wall-clock and
per CPU-second (the machine is shared: CPU-seconds are the steadier figure), and engine / transformers ratios.

The greedy outputs are compared too (the share of identical tokens): both run the same model, so a throughput won
by computing something else would show here. Last, the floor: the model's projections alone (every linear layer +
the LM head, the shapes of one decode step) with transformers' kernel (``nn.Linear``) and with the engine's, per
step, beside each side's whole decode step: how much of a step is those GEMMs.

    .venv/bin/python svc-proxy/bench/engine_vs_hf.py [--model smollm2-135m] [--batches 1,8,32] [--new 32]
        [--projections onednn|onednn-bf16] [--mismatch 16]

``--mismatch N`` then samples N requests at temperature 1 from the engine and scores the sampled tokens with the
trainer's own code (``opengyre.models.token_logprobs``, float32, the same weights): per token the log ratio
``r = logp_trainer - logp_engine``, reported as verl and slime do — the KL estimate ``k3 = E[exp(r) - 1 - r]``,
mean and max ``|r|``, and the spread of the importance ratio ``exp(r)`` (std, and its 1st/99th percentiles).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import torch

from opengyre.chat import ChatCodec
from opengyre.engine import CpuEngine, EngineConfig, Projections, SamplingParams
from opengyre.models import resolve_model, token_logprobs

QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers greater than 50.",
    "How do I reverse a list in Python?",
    "What causes the seasons on Earth?",
    "Give me a name for a grey cat.",
    "Translate 'good morning' into Spanish.",
]


@dataclass
class Run:
    wall: float
    cpu: float
    outputs: list[list[int]]


@dataclass
class Side:
    """One side's best prefill-only and full runs over the repeats."""

    first: Run | None = None
    full: Run | None = None

    def keep(self, first: Run, full: Run) -> None:
        if self.first is None or first.wall < self.first.wall:
            self.first = first
        if self.full is None or full.wall < self.full.wall:
            self.full = full

    def rates(self, prompt_tokens: int, decoded: int) -> tuple[float, float, float, float]:
        """prefill tok/s, decode tok/s, prefill tok/CPU-s, decode tok/CPU-s."""
        assert self.first is not None and self.full is not None
        dw = max(self.full.wall - self.first.wall, 1e-9)
        dc = max(self.full.cpu - self.first.cpu, 1e-9)
        return prompt_tokens / self.first.wall, decoded / dw, prompt_tokens / self.first.cpu, decoded / dc


def prompts(codec: ChatCodec, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        q = QUESTIONS[i % len(QUESTIONS)] + ("" if i < len(QUESTIONS) else f" (variant {i})")
        out.append(codec.render_ids([{"role": "user", "content": q}]))
    return out


async def run_engine(engine: CpuEngine, batch: list[list[int]], new: int) -> Run:
    params = SamplingParams(max_new_tokens=new, temperature=0.0, ignore_eos=True)

    async def one(ids: list[int]) -> list[int]:
        last: list[int] = []
        async for g in engine.generate(ids, params):
            last = g.output_ids
        return list(last)

    w, c = time.perf_counter(), time.process_time()
    outs = await asyncio.gather(*(one(p) for p in batch))
    return Run(time.perf_counter() - w, time.process_time() - c, outs)


def run_hf(model: torch.nn.Module, batch: list[list[int]], new: int, pad: int) -> Run:
    n = max(len(p) for p in batch)
    ids = torch.tensor([[pad] * (n - len(p)) + p for p in batch])  # left padding, as generate expects
    mask = torch.tensor([[0] * (n - len(p)) + [1] * len(p) for p in batch])
    w, c = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        out = model.generate(  # type: ignore[operator]
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=pad,
        )
    return Run(time.perf_counter() - w, time.process_time() - c, [r[n:].tolist() for r in out])


def same(a: list[list[int]], b: list[list[int]], eos: int) -> float:
    """The share of the engine's tokens up to its first eos that transformers produced too (past an eos the two
    differ by design: the engine emits it and goes on, ``min_new_tokens`` forbids it)."""
    agree = total = 0
    for x, y in zip(a, b, strict=True):
        x = x[: x.index(eos) + 1] if eos in x else x
        k = 0
        while k < min(len(x), len(y)) and x[k] == y[k]:
            k += 1
        agree, total = agree + k, total + len(x)
    return agree / max(total, 1)


def projections_cpu_s(proj: Projections, layers: int, hidden: int, b: int, reps: int = 3) -> float:
    """CPU-seconds of one decode step's projections alone (every layer's, then the LM head) at batch ``b``."""
    x = torch.randn(b, hidden)

    def step() -> None:
        for i in range(layers):
            proj.qkv(i, x)
            proj.o(i, x)
            proj.mlp(i, x)
        proj.lm_head(x)

    with torch.inference_mode():
        step()
        c = time.process_time()
        for _ in range(reps):
            step()
    return (time.process_time() - c) / reps


def floor_line(name: str, step_cpu: float, gemm: Callable[[], float]) -> str:
    g = gemm()
    return f"  {name:<14} decode step {step_cpu * 1e3:7.1f} ms CPU, projections alone {g * 1e3:7.1f} ms ({g / step_cpu:.0%})"


async def mismatch(engine: CpuEngine, trainer_model: torch.nn.Module, batch: list[list[int]], new: int) -> str:
    """The engine's behaviour logprobs of its own samples against the trainer's for the same tokens."""
    params = SamplingParams(max_new_tokens=new, temperature=1.0, ignore_eos=True)

    async def one(ids: list[int]) -> tuple[list[int], list[float]]:
        last_ids: list[int] = []
        last_lps: list[float] = []
        async for g in engine.generate(ids, params):
            last_ids, last_lps = list(g.output_ids), list(g.output_logprobs)
        return last_ids, last_lps

    rs: list[torch.Tensor] = []
    for prompt, (out, lps) in zip(batch, await asyncio.gather(*(one(p) for p in batch)), strict=True):
        seq = torch.tensor([prompt + out])
        with torch.inference_mode():
            lp = token_logprobs(trainer_model, seq)[0, len(prompt) - 1 :]  # type: ignore[arg-type]
        rs.append(lp - torch.tensor(lps, dtype=torch.float32))
    r = torch.cat(rs).double()
    ratio = r.exp()
    k3 = (ratio - 1 - r).mean().item()
    q = torch.quantile(ratio, torch.tensor([0.01, 0.99], dtype=torch.float64))
    return (
        f"train/rollout mismatch ({type(engine.runner.fast).__name__}, {len(r)} sampled tokens, temperature 1): "
        f"KL k3 {k3:.3e}, mean |r| {r.abs().mean().item():.3e}, max |r| {r.abs().max().item():.3e}, "
        f"IS ratio std {ratio.std().item():.3e}, p1-p99 {q[0].item():.4f}-{q[1].item():.4f}"
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--projections", default="onednn", help="the engine's GEMM kernel (EngineConfig.projections)")
    ap.add_argument("--mismatch", type=int, default=0, help="requests sampled to measure the train/rollout gap")
    ap.add_argument("--skip-throughput", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    engine = CpuEngine(EngineConfig(preset=args.model, prefix_cache_tokens=0, projections=args.projections))
    engine.start()
    hf, _ = source.load()  # the same weights, a model of its own
    hf.eval()  # type: ignore[no-untyped-call]
    codec = engine.codec
    pad = codec.eos_id
    cfg = hf.config
    print(
        f"model {args.model}, {args.new} new tokens a request, greedy, {args.threads} torch thread(s), "
        f"engine projections: {type(engine.runner.fast).__name__}, load {os.getloadavg()[0]:.1f}"
    )
    print(
        "batch  prompt_tok | prefill tok/s: engine   hf  ratio | decode tok/s: engine   hf  ratio |"
        " per CPU-s prefill: engine  hf  ratio | decode: engine  hf  ratio | same_tokens"
    )
    floors: list[str] = []
    try:
        for b in [] if args.skip_throughput else (int(x) for x in args.batches.split(",")):
            batch = prompts(codec, b)
            await run_engine(engine, batch, 2)  # warm-up (allocations, first calls)
            run_hf(hf, batch, 2, pad)
            eng, ref = Side(), Side()
            for _ in range(args.repeats):  # interleaved, best of: the machine is shared
                eng.keep(await run_engine(engine, batch, 1), await run_engine(engine, batch, args.new))
                ref.keep(run_hf(hf, batch, 1, pad), run_hf(hf, batch, args.new, pad))
            ptoks, dtoks = sum(map(len, batch)), b * (args.new - 1)
            ep, ed, epc, edc = eng.rates(ptoks, dtoks)
            hp, hd, hpc, hdc = ref.rates(ptoks, dtoks)
            assert eng.full is not None and ref.full is not None
            print(
                f"{b:>5}  {ptoks:>10} | {ep:>20.1f} {hp:>5.1f} {ep / hp:>5.2f} | {ed:>19.1f} {hd:>5.1f} "
                f"{ed / hd:>5.2f} | {epc:>26.1f} {hpc:>4.1f} {epc / hpc:>5.2f} | {edc:>14.1f} {hdc:>4.1f} "
                f"{edc / hdc:>5.2f} | {same(eng.full.outputs, ref.full.outputs, pad):>11.2f}",
                flush=True,
            )
            floors.append(f"batch {b}:")
            layers, hidden = cfg.num_hidden_layers, cfg.hidden_size
            floors.append(
                floor_line("engine", b / edc, partial(projections_cpu_s, engine.runner.fast, layers, hidden, b))
            )
            floors.append(
                floor_line("transformers", b / hdc, partial(projections_cpu_s, Projections(hf), layers, hidden, b))
            )
        if args.mismatch:
            print(await mismatch(engine, hf, prompts(codec, args.mismatch), args.new))
    finally:
        engine.stop()
    print("where a decode step's CPU time goes (projections: every linear layer + the LM head at that batch):")
    print("\n".join(floors))
    print(f"load {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    asyncio.run(main())
