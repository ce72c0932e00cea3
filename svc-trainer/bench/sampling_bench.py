"""Bounded sampling on branching agentic trees: forward/backward tokens and time for J = 1, 5 and all paths,
and the gradient norm of each (QwenGyre: J = 5 costs 74.8% of all paths; J = 1 gives a larger gradient norm).

    .venv/bin/python svc-trainer/bench/sampling_bench.py [--model small] [--executions 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

from opengyre.models import model_config
from opengyre.trainer import Learner, PathSampler, TreeShape, agentic_tree, execution_samples, pack_samples, sample_cost
from opengyre.trainer.algorithms import GSPO, group_advantages
from opengyre.trainer.backends import build_backend

SETTINGS = {"J=1": 1, "J=5": 5, "all": None}


def batch(seed: int, executions: int, j: int | None, shape: TreeShape):  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    trees = [agentic_tree(f"e{i}", rng, shape) for i in range(executions)]
    rewards = [rng.random() for _ in trees]
    adv, _, _ = group_advantages(rewards)
    sampler = PathSampler(j)
    samples, costs = [], []
    for t, a in zip(trees, adv, strict=True):
        drawn = sampler.sample(t, random.Random(f"{seed}:{t.execution_id}"))
        costs.append(sample_cost(t, drawn))
        samples += execution_samples(t.execution_id, drawn, a, 1 / len(trees))
    return samples, costs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--executions", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, default=4, help="independent batches for the gradient-norm comparison")
    ap.add_argument("--micro-batch-tokens", type=int, default=4096)
    ap.add_argument("--retry-p", type=float, default=0.2, help="chance a turn was retried (more leaves)")
    ap.add_argument("--subagents", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
    shape = TreeShape(retry_p=args.retry_p, sub_retry_p=args.retry_p, subagents=args.subagents)
    cfg = model_config(args.model)
    backend = build_backend("torch", cfg, seed=0)
    learner = Learner(backend, GSPO(eps_low=0.2, eps_high=0.2))
    print(f"model {args.model}, {args.executions} executions per batch, tree shape {shape}")
    rows: dict[str, dict[str, float]] = {}
    timed = {}
    for name, j in SETTINGS.items():
        norms = []
        for b in range(args.batches):
            samples, costs = batch(1000 + b, args.executions, j, shape)
            mbs = pack_samples(samples, args.micro_batch_tokens)
            if b == 0:
                timed[name] = mbs
                rows[name] = dict(
                    leaves=sum(c.leaves for c in costs), paths=sum(c.paths for c in costs),
                    generated=sum(c.generated_tokens for c in costs), targets=sum(c.target_tokens for c in costs),
                    forward=sum(c.forward_tokens for c in costs), all_forward=sum(c.all_paths_forward_tokens for c in costs),
                    padded=sum(m.padded_tokens for m in mbs),
                )  # fmt: skip
            backend.zero_grad()
            for mb in mbs:
                learner.accumulate(mb)
            norms.append(learner.grad_norm())
            backend.zero_grad()
        rows[name].update(norm=statistics.mean(norms), norm_sd=statistics.pstdev(norms))
    # Timing: the settings interleaved, best of N (the machine is shared: the minimum is the least disturbed run).
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.repeats):
        for name, mbs in timed.items():
            backend.zero_grad()
            t0 = time.perf_counter()
            for mb in mbs:
                learner.accumulate(mb)
            times[name].append(time.perf_counter() - t0)
    for name in SETTINGS:
        rows[name]["time"] = min(times[name])
    base = rows["all"]
    print()
    print(
        "| setting | paths / leaves | targets / generated | forward tokens | vs all | padded tokens | "
        "fwd+bwd s (best) | vs all | grad norm (mean ± sd) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(
            f"| {name} | {r['paths']}/{r['leaves']} | {r['targets']}/{r['generated']} | {r['forward']} | "
            f"{r['forward'] / base['forward']:.1%} | {r['padded']} | {r['time']:.2f} | {r['time'] / base['time']:.1%} | "
            f"{r['norm']:.4f} ± {r['norm_sd']:.4f} |"
        )


if __name__ == "__main__":
    main()
