"""Peak RSS of one trainer step (proximal pass, forward + backward, AdamW update) on one micro-batch of SmolLM2-135M's
shape, with the LM head's logits whole (``--chunk 0``, the trainer before chunking) against chunked (the default).

    .venv/bin/python svc-trainer/bench/logits_memory_bench.py [--tokens 4096] [--rows 4] [--chunks 0,default]

Each variant runs in a fresh child process (``ru_maxrss`` is a process's high-water mark); random weights of the
real shape (30 layers, hidden 576, vocab 49,152, tied head: the peak depends on shapes, not values). Prints the
RSS before the step (model built), the peak during it, the step's own rise, its wall time, and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from typing import Any

SMOLLM2_135M: dict[str, Any] = {
    "vocab_size": 49_152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
    "max_position_embeddings": 8192,
}


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(tokens: int, rows: int, chunk: int | None, layers: bool = False) -> dict[str, float]:
    import torch
    from transformers import LlamaConfig

    from opengyre.trainer import Learner, TrainingSample, pack_samples
    from opengyre.trainer.algorithms import GSPO
    from opengyre.trainer.backends import TorchBackend

    torch.manual_seed(0)
    cfg = LlamaConfig(**SMOLLM2_135M)
    cfg._attn_implementation = "sdpa"
    backend = TorchBackend.from_config(cfg, seed=0)
    backend.chunk_tokens = chunk
    if layers:  # what is left is the decoder layers' activations: recompute them in backward too (HF's own)
        backend.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})  # type: ignore[no-untyped-call]
    learner = Learner(backend, GSPO(eps_low=0.2, eps_high=0.2), lr=1e-5)
    rng = random.Random(0)
    seq = tokens // rows
    samples = []
    for i in range(rows):
        targets = tuple(t >= seq // 4 for t in range(seq))
        samples.append(
            TrainingSample(
                execution_id=f"e{i}", leaf="l", tokens=tuple(rng.randrange(cfg.vocab_size) for _ in range(seq)),
                targets=targets, behaviour_logprobs=tuple(-rng.random() * 3 if m else 0.0 for m in targets),
                advantage=rng.uniform(-1, 1), token_weight=1.0 / (rows * sum(targets)), temperatures=(0.7,) * seq,
            )
        )  # fmt: skip
    [mb] = pack_samples(samples, tokens)
    before = _rss_mb()
    t0, c0 = time.perf_counter(), time.process_time()
    r = learner.step([mb])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"before_mb": before, "peak_mb": peak, "wall_s": wall, "cpu_s": cpu, "loss": r.loss, "tokens": mb.n_tokens}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096, help="padded tokens of the micro-batch (the default size)")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument(
        "--chunks",
        default="0,default",
        help="variants: chunk_tokens (0 = whole logits, default = by the budget), +layers = layer checkpointing too",
    )
    ap.add_argument("--child", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        name, _, extra = args.child.partition("+")
        chunk = None if name == "default" else int(name)
        print(json.dumps(child(args.tokens, args.rows, chunk, layers=extra == "layers")))
        return
    results = {}
    for variant in args.chunks.split(","):
        cmd = [sys.executable, __file__, "--tokens", str(args.tokens), "--rows", str(args.rows), "--child", variant]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[variant] = json.loads(out.strip().splitlines()[-1])
    print(
        f"SmolLM2-135M shape, one step on {args.rows} x {args.tokens // args.rows} tokens (torch backend, GSPO, AdamW)"
    )
    print("| chunk_tokens | RSS before MB | peak RSS MB | step's rise MB | step wall s | step CPU s | loss |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for v, r in results.items():
        print(
            f"| {v} | {r['before_mb']:,.0f} | {r['peak_mb']:,.0f} | {r['peak_mb'] - r['before_mb']:,.0f} | "
            f"{r['wall_s']:.2f} | {r['cpu_s']:.2f} | {r['loss']:+.6f} |"
        )
    if "0" in results and len(results) > 1:
        base = results["0"]
        for v, r in results.items():
            if v != "0":
                print(
                    f"chunk {v} / whole: peak RSS {r['peak_mb'] / base['peak_mb']:.2f}x, step's rise "
                    f"{(r['peak_mb'] - r['before_mb']) / (base['peak_mb'] - base['before_mb']):.2f}x, wall "
                    f"{r['wall_s'] / base['wall_s']:.2f}x"
                )


if __name__ == "__main__":
    main()
