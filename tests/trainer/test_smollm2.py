"""The trainer on SmolLM2-135M-Instruct, the real pretrained model: torch and megatron-core load the same
weights (tied embeddings, HF -> megatron names) and agree on loss and gradients; a published step hot-reloaded
by the CPU engine gives the engine's logprobs equal to the trainer's (self-consistency: both run our model code, so this
checks the reload, not an independent engine)."""

from __future__ import annotations

import random
from pathlib import Path

import httpx
import pytest
import torch

from opengyre.engine import EngineConfig, EngineServer
from opengyre.models import ModelSource, model_state
from opengyre.trainer import Learner, PathSampler, execution_samples, pack_samples, reload_engines, write_checkpoint
from opengyre.trainer.algorithms import GRPO
from opengyre.trainer.backends import Backend, build_backend
from opengyre.trajectory import Node, TrajectoryTree


@pytest.fixture(scope="module")
def torch_backend(smollm2: ModelSource) -> Backend:
    model, _ = smollm2.load()
    return build_backend("torch", model.config, model_state(model))


def _conversation_batch(smollm2: ModelSource) -> list:  # type: ignore[type-arg]
    """One short real exchange, tokenized by the model's own tokenizer and template."""
    tok = smollm2.tokenizer()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    p_ids = tok.encode(prompt, add_special_tokens=False)
    out = [*tok.encode("The capital of France is Paris.", add_special_tokens=False), tok.eos_token_id]
    rng = random.Random(0)
    lps = tuple(-rng.random() for _ in out)
    tree = TrajectoryTree("e", [Node("c", None, 0, tuple(p_ids), tuple(out), lps, temperature=1.0)])
    return pack_samples(execution_samples("e", PathSampler(1).sample(tree, random.Random(0)), 1.0), 10_000)


# A 135M-parameter model on 2 shared cores: minutes, not seconds, when the machine is busy.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


def test_torch_and_megatron_agree_on_loss_and_gradients(smollm2: ModelSource, torch_backend: Backend) -> None:
    mbs = _conversation_batch(smollm2)
    megatron = build_backend("megatron", torch_backend.config, torch_backend.hf_state_dict())
    assert set(megatron.hf_state_dict()) == set(torch_backend.hf_state_dict())  # the tied head stored once
    results = {}
    for backend in (torch_backend, megatron):
        learner = Learner(backend, GRPO())
        backend.zero_grad()
        loss = sum(learner.accumulate(m).loss for m in mbs)
        results[backend.name] = (loss, backend.hf_grads(), learner.grad_norm())
    (lt, gt, nt), (lm, gm, nm) = results["torch"], results["megatron"]
    assert nt > 0 and lm == pytest.approx(lt, rel=1e-5, abs=1e-6)
    assert nm == pytest.approx(nt, rel=1e-4)
    assert set(gm) == set(gt)
    for k in gt:
        torch.testing.assert_close(gm[k], gt[k], rtol=1e-3, atol=1e-6)
    torch_backend.zero_grad()


async def test_engine_logprobs_equal_the_trainers_after_a_hot_reload(
    smollm2: ModelSource, torch_backend: Backend, tmp_path: Path
) -> None:
    mbs = _conversation_batch(smollm2)
    Learner(torch_backend, GRPO(), lr=1e-4).step(mbs)  # weights now differ from the pretrained ones
    ckpt = write_checkpoint(torch_backend, tmp_path, "run", 1)
    assert smollm2.checkpoint is not None
    cfg = EngineConfig(preset="smollm2-135m", model_cache=smollm2.checkpoint.parent)
    async with EngineServer(cfg) as srv:
        [reload] = await reload_engines([srv.url], ckpt)
        assert reload.success, reload.message
        tokens = mbs[0].input_ids[0].tolist()
        async with httpx.AsyncClient(timeout=300) as client:
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
    served = torch.tensor([e[0] for e in meta["input_token_logprobs"]][1:], dtype=torch.float32)
    with torch.no_grad():
        ours = torch_backend.token_logprobs(mbs[0])[0, : len(tokens) - 1]
    assert torch.equal(served, ours)  # same model code, same weights: what is served is what is trained
