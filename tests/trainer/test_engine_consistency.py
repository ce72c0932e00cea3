"""Train/inference consistency through the real CPU engine: the trainer publishes a step, the engine
hot-reloads it over SGLang's ``/update_weights_from_disk``, and the engine's prompt logprobs for the same
tokens equal the trainer's, bit for bit.

A self-consistency test: the CPU engine and the trainer run the same model code (``opengyre.models``), so this
checks publishing, hot reload and the temperature path, not agreement with an independent engine (SGLang, vLLM)."""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import httpx
import pytest
import torch

from opengyre.engine import EngineConfig, EngineServer
from opengyre.models import model_config
from opengyre.trainer import Learner, PathSampler, execution_samples, pack_samples, reload_engines, write_checkpoint
from opengyre.trainer.algorithms import GRPO
from opengyre.trainer.backends import build_backend
from opengyre.trajectory import Node, TrajectoryTree

from .test_backends import random_tree


@pytest.mark.parametrize("backend_name", ["torch", "megatron"])
async def test_engine_reloads_published_weights_and_agrees(tmp_path: Path, backend_name: str) -> None:
    backend = build_backend(backend_name, model_config("tiny"), seed=11)
    drawn = PathSampler(5).sample(random_tree(7, "e"), random.Random(0))
    samples = execution_samples("e", drawn, 1.0)
    mbs = pack_samples(samples, 10_000)
    Learner(backend, GRPO(), lr=1e-2).step(mbs)  # weights now differ from any seed's
    ckpt = write_checkpoint(backend, tmp_path, "run", 1)

    async with EngineServer(EngineConfig(preset="tiny", seed=0)) as srv:
        [reload] = await reload_engines([srv.url], ckpt)
        assert reload.success, reload.message
        tokens = list(samples[0].tokens)
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(
                srv.url + "/generate",
                json={
                    "input_ids": tokens,
                    "return_logprob": True,
                    "logprob_start_len": 0,
                    "sampling_params": {"max_new_tokens": 1, "temperature": 0.0},
                },
            )
        r.raise_for_status()
        meta = r.json()["meta_info"]
    assert meta["weight_version"] == "run-s1"
    engine_lp = [e[0] for e in meta["input_token_logprobs"]][1:]  # position 0 has no logprob
    assert [e[1] for e in meta["input_token_logprobs"]] == tokens
    mb = pack_samples(samples[:1], 10_000)[0]
    with torch.no_grad():
        ours = backend.token_logprobs(mb)[0, : len(tokens) - 1]
    served = torch.tensor(engine_lp, dtype=torch.float32)
    if backend_name == "torch":
        # Exactly equal: same model code, same weights, no drift between what was trained and what is served.
        assert torch.equal(served, ours)
    else:
        # Megatron's layers are other code over the same weights: equal up to float summation order.
        torch.testing.assert_close(served, ours, rtol=0, atol=1e-5)


async def test_engine_logprobs_at_temperature_07_equal_the_trainers(tmp_path: Path) -> None:
    """The engine records logprobs after temperature; the trainer computes them at the call's temperature too."""
    backend = build_backend("torch", model_config("tiny"), seed=11)
    ckpt = write_checkpoint(backend, tmp_path, "run", 1)
    prompt = list(range(40, 64))
    async with EngineServer(EngineConfig(preset="tiny", seed=0)) as srv:
        [reload] = await reload_engines([srv.url], ckpt)
        assert reload.success, reload.message
        async with httpx.AsyncClient(timeout=60) as client:
            r = await client.post(
                srv.url + "/generate",
                json={
                    "input_ids": prompt,
                    "return_logprob": True,
                    "sampling_params": {"max_new_tokens": 16, "temperature": 0.7, "sampling_seed": 3},
                },
            )
        r.raise_for_status()
    out = r.json()["meta_info"]["output_token_logprobs"]
    ids, lps = [int(e[1]) for e in out], [float(e[0]) for e in out]
    tree = TrajectoryTree("e", [Node("c", None, 0, tuple(prompt), tuple(ids), tuple(lps), temperature=0.7)])
    [mb] = pack_samples(execution_samples("e", PathSampler(1).sample(tree, random.Random(0)), 1.0), 10_000)
    assert mb.n_targets == len(ids)
    engine = torch.tensor(lps, dtype=torch.float32)
    with torch.no_grad():
        ours = backend.token_logprobs(mb)[mb.mask]
        at_one = backend.token_logprobs(dataclasses.replace(mb, temperatures=None))[mb.mask]
    # Decoding runs with a KV cache, the trainer over the whole sequence: equal up to float summation order.
    torch.testing.assert_close(ours, engine, rtol=0, atol=1e-5)
    assert float((at_one - engine).abs().max()) > 0.05  # at T = 1 both the ratio and the gradient were biased
