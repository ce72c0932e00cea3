"""What ignoring the sampling temperature costs: KL(engine || trainer) on the engine's own samples.

The built-in CPU engine samples 64 continuations of 24 tokens at each temperature (seeded) and records their
logprobs (after temperature, as SGLang does); the trainer computes the same tokens' logprobs with the same weights
at the call's temperature (what it does now) and at 1 (what it did before). Both figures come from the same run.

    .venv/bin/python svc-trainer/bench/temperature_bench.py
"""

from __future__ import annotations

import asyncio
import dataclasses
import random

import httpx
import torch

from opengyre.engine import EngineConfig, EngineServer
from opengyre.models import model_config
from opengyre.trainer import PathSampler, execution_samples, pack_samples, write_checkpoint
from opengyre.trainer.algorithms import mismatch_metrics
from opengyre.trainer.backends import build_backend
from opengyre.trajectory import Node, TrajectoryTree


async def main() -> None:
    import tempfile
    from pathlib import Path

    backend = build_backend("torch", model_config("tiny"), seed=11)
    work = Path(tempfile.mkdtemp(prefix="og-temp-"))
    ckpt = write_checkpoint(backend, work, "bench", 1)
    rng = random.Random(0)
    prompts = [[rng.randrange(32, 250) for _ in range(16)] for _ in range(64)]
    print("| sampling T | KL(engine ‖ trainer at T) | KL(engine ‖ trainer at 1) | mean abs Δlogprob at T | at 1 |")
    print("| --- | --- | --- | --- | --- |")
    async with (
        EngineServer(EngineConfig(preset="tiny", checkpoint=ckpt.path)) as srv,
        httpx.AsyncClient(timeout=120) as client,
    ):
        for t in (0.7, 1.0, 1.3):
            samples = []
            for i, p in enumerate(prompts):
                body = {
                    "input_ids": p,
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 24, "temperature": t, "sampling_seed": i},
                }
                r = await client.post(srv.url + "/generate", json=body)
                out = r.json()["meta_info"]["output_token_logprobs"]
                ids, lps = tuple(int(e[1]) for e in out), tuple(float(e[0]) for e in out)
                tree = TrajectoryTree(f"e{i}", [Node("c", None, 0, tuple(p), ids, lps, temperature=t)])
                samples += execution_samples(f"e{i}", PathSampler(1).sample(tree, random.Random(0)), 1.0)
            at_t, at_1 = {}, {}
            for mb in pack_samples(samples, 100_000):
                with torch.no_grad():
                    a = mismatch_metrics(backend.token_logprobs(mb), mb.behaviour_logprobs, mb.mask)
                    one = dataclasses.replace(mb, temperatures=None)
                    b = mismatch_metrics(backend.token_logprobs(one), mb.behaviour_logprobs, mb.mask)
                at_t, at_1 = a, b  # one micro-batch holds them all
            print(
                f"| {t} | {at_t['mismatch_kl']:.2e} | {at_1['mismatch_kl']:.2e} | "
                f"{at_t['mismatch_abs_diff']:.2e} | {at_1['mismatch_abs_diff']:.2e} |"
            )


if __name__ == "__main__":
    asyncio.run(main())
