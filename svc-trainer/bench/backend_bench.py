"""Training throughput per backend on this machine: tokens/s of forward + backward (+ optimizer step) for the
same packed micro-batches on the torch backend and the megatron-core backend (TP=1, CPU, gloo, SDPA).

    .venv/bin/python svc-trainer/bench/backend_bench.py [--model small] [--rows 8] [--seq 256] [--iters 5]

``--model`` is any registered model (``tiny``, ``small``, ``smollm2-135m``, a folder or a .gguf): a pretrained
model starts both backends from its own weights. The megatron / torch ratio is printed last.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from opengyre.models import model_state, resolve_model
from opengyre.trainer import Learner, TrainingSample, pack_samples
from opengyre.trainer.algorithms import GSPO
from opengyre.trainer.backends import build_backend


def samples(rows: int, seq: int, seed: int, vocab: int = 256) -> list[TrainingSample]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        toks = tuple(rng.randrange(vocab) for _ in range(seq))
        targets = tuple(t >= seq // 4 for t in range(seq))  # a prompt quarter, then generated tokens
        out.append(
            TrainingSample(
                execution_id=f"e{i}",
                leaf="l",
                tokens=toks,
                targets=targets,
                behaviour_logprobs=tuple(-rng.random() * 3 if m else 0.0 for m in targets),
                advantage=rng.uniform(-1, 1),
                token_weight=1.0 / (rows * sum(targets)),
                temperatures=(1.0,) * seq,
            )
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    source = resolve_model(args.model)
    weights, _ = source.load(seed=0)
    cfg = weights.config
    init = model_state(weights)
    del weights
    [mb] = pack_samples(samples(args.rows, args.seq, 0, min(cfg.vocab_size, 32_000)), args.rows * args.seq)
    print(f"model {args.model}, micro-batch {args.rows} x {args.seq} tokens, torch threads {torch.get_num_threads()}")
    learners = {}
    for name in ("torch", "megatron"):
        learners[name] = Learner(build_backend(name, cfg, init), GSPO(eps_low=0.2, eps_high=0.2), lr=1e-4)
        learners[name].step([mb])  # warm-up (allocations, first-call overheads)
    times: dict[str, list[float]] = {name: [] for name in learners}
    losses: dict[str, float] = {}
    for _ in range(args.iters):  # interleaved: both backends see the same machine load
        for name, learner in learners.items():
            t0 = time.perf_counter()
            r = learner.step([mb])
            times[name].append(time.perf_counter() - t0)
            losses.setdefault(name, r.loss)
    print(f"| backend | fwd+bwd+step s (best of {args.iters}) | median | tokens/s (best) | first loss |")
    print("| --- | --- | --- | --- | --- |")
    for name, ts in times.items():
        best = min(ts)
        print(
            f"| {name} | {best:.3f} | {statistics.median(ts):.3f} | {mb.n_tokens / best:,.0f} | {losses[name]:+.5f} |"
        )
    print(
        f"megatron / torch tokens/s: best {min(times['torch']) / min(times['megatron']):.2f}, median "
        f"{statistics.median(times['torch']) / statistics.median(times['megatron']):.2f}"
    )


if __name__ == "__main__":
    main()
