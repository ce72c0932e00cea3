"""Train/inference consistency through the real CPU engine: the trainer publishes a step, the engine
hot-reloads it over SGLang's ``/update_weights_from_disk``, and the engine's prompt logprobs for the same
tokens equal the trainer's, bit for bit."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
import torch

from opengyre.models import model_config
from opengyre.proxy.engine import EngineConfig, EngineServer
from opengyre.trainer import Learner, PathSampler, execution_samples, pack_samples, reload_engines, write_checkpoint
from opengyre.trainer.algorithms import GRPO
from opengyre.trainer.backends import build_backend

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
