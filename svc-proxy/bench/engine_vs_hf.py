"""The CPU engine's generation throughput on a real model against transformers' ``generate``, in one process.

Same weights, same prompts (chat prompts rendered by the model's template), greedy, a fixed number of new tokens
(eos ignored on both sides so every request decodes the same length), the same torch thread count. For each
batch size: prefill + decode tokens/s of each, wall-clock and per CPU-second, and engine / transformers ratios.
The greedy outputs are compared too (the share of identical tokens): both run the same model, so a throughput
won by computing something else would show here.

    .venv/bin/python svc-proxy/bench/engine_vs_hf.py [--model smollm2-135m] [--batches 1,8] [--new 32]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from dataclasses import dataclass

import torch

from opengyre.models import resolve_model
from opengyre.proxy import ChatCodec
from opengyre.proxy.engine import CpuEngine, EngineConfig, SamplingParams

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


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    engine = CpuEngine(EngineConfig(preset=args.model, prefix_cache_tokens=0))
    engine.start()
    hf, _ = source.load()  # the same weights, a model of its own
    hf.eval()  # type: ignore[no-untyped-call]
    codec = engine.codec
    pad = codec.eos_id
    print(f"model {args.model}, {args.new} new tokens a request, greedy, {args.threads} torch thread(s)")
    print("batch  prompt_tok  engine_tok/s  hf_tok/s  ratio  engine_tok/cpu_s  hf_tok/cpu_s  cpu_ratio  same_tokens")
    try:
        for b in (int(x) for x in args.batches.split(",")):
            batch = prompts(codec, b)
            await run_engine(engine, batch[:1], 2)  # warm-up (allocations, the first graph)
            run_hf(hf, batch[:1], 2, pad)
            best_e = best_h = None
            for _ in range(args.repeats):  # interleaved, best of: the machine is shared
                e = await run_engine(engine, batch, args.new)
                h = run_hf(hf, batch, args.new, pad)
                best_e = e if best_e is None or e.wall < best_e.wall else best_e
                best_h = h if best_h is None or h.wall < best_h.wall else best_h
            assert best_e is not None and best_h is not None
            toks = b * args.new
            et, ht = toks / best_e.wall, toks / best_h.wall
            ec, hc = toks / best_e.cpu, toks / best_h.cpu
            print(
                f"{b:>5}  {sum(map(len, batch)):>10}  {et:>12.1f}  {ht:>8.1f}  {et / ht:>5.2f}  {ec:>16.1f}  "
                f"{hc:>12.1f}  {ec / hc:>9.2f}  {same(best_e.outputs, best_h.outputs, pad):>11.2f}"
            )
    finally:
        engine.stop()


if __name__ == "__main__":
    asyncio.run(main())
