"""The torch and megatron-core backends: same packed micro-batches, same initial weights -> same loss and
gradients (float tolerance), and the same weights after optimizer steps."""

from __future__ import annotations

import random

import pytest
import torch

from opengyre.models import model_config
from opengyre.trainer import Learner, PathSampler, execution_samples, pack_samples
from opengyre.trainer.algorithms import GRPO, GSPO, SFT, Algorithm
from opengyre.trainer.backends import TorchBackend, build_backend, hf_to_mcore, mcore_to_hf
from opengyre.trajectory import TrajectoryTree

from ._trees import node


def random_tree(seed: int, execution_id: str) -> TrajectoryTree:
    rng = random.Random(seed)

    def toks(n: int) -> list[int]:
        return [rng.randrange(256) for _ in range(n)]

    t = TrajectoryTree(execution_id)
    t.add(node("r", None, 0, toks(12), toks(8)))
    t.add(node("b1", "r", 20, toks(6), toks(9)))
    t.add(node("b2", "r", 15, toks(4), toks(11)))
    t.add(node("sub", None, 0, toks(7), toks(10), role="sub-agent"))
    for n in t.nodes.values():
        object.__setattr__(n, "output_logprobs", tuple(-rng.random() * 4 for _ in n.output_ids))
    return t


def batches(max_tokens: int = 96) -> list:  # type: ignore[type-arg]
    samples = []
    for i, adv in enumerate([0.8, -0.5, 1.2]):
        drawn = PathSampler(5).sample(random_tree(i, f"e{i}"), random.Random(i))
        samples += execution_samples(f"e{i}", drawn, adv, 1 / 3)
    return pack_samples(samples, max_tokens)


@pytest.fixture(scope="module")
def cfg():  # type: ignore[no-untyped-def]
    return model_config("tiny")


def test_weight_maps_round_trip(cfg) -> None:  # type: ignore[no-untyped-def]
    sd = TorchBackend.from_config(cfg, seed=5).hf_state_dict()
    back = mcore_to_hf(hf_to_mcore(sd, cfg), cfg)
    assert set(back) == {k for k in sd if "rotary" not in k}
    assert all(torch.equal(back[k], sd[k]) for k in back)
    # tensor-parallel shards put back together give the full layout again
    from opengyre.trainer.backends._mcore_weights import unshard

    shards = [hf_to_mcore(sd, cfg, r, 2) for r in range(2)]
    full = hf_to_mcore(sd, cfg)
    for k in full:
        assert torch.equal(unshard(k, [s[k] for s in shards]), full[k]), k


@pytest.mark.parametrize("algo", [GRPO(), GSPO(eps_low=0.05, eps_high=0.05), SFT()], ids=lambda a: a.name)
def test_same_loss_and_gradients(cfg, algo: Algorithm) -> None:  # type: ignore[no-untyped-def]
    tb = build_backend("torch", cfg, seed=3)
    mb = build_backend("megatron", cfg, tb.hf_state_dict())
    mbs = batches()
    assert len(mbs) > 1  # several micro-steps accumulate
    results = {}
    for backend in (tb, mb):
        learner = Learner(backend, algo)
        backend.zero_grad()
        loss = sum(learner.accumulate(m).loss for m in mbs)
        results[backend.name] = (loss, backend.hf_grads(), learner.grad_norm())
    (lt, gt, nt), (lm, gm, nm) = results["torch"], results["megatron"]
    assert lm == pytest.approx(lt, rel=1e-5, abs=1e-7)
    assert nm == pytest.approx(nt, rel=1e-5)
    assert nt > 0
    for k in gt:
        torch.testing.assert_close(gm[k], gt[k], rtol=1e-4, atol=1e-6)


def test_same_weights_after_optimizer_steps(cfg) -> None:  # type: ignore[no-untyped-def]
    tb = build_backend("torch", cfg, seed=4)
    mb = build_backend("megatron", cfg, tb.hf_state_dict())
    learners = [Learner(b, GRPO(), lr=1e-2) for b in (tb, mb)]
    mbs = batches()
    for _ in range(2):
        r = [learner.step(mbs) for learner in learners]
        assert r[0].loss == pytest.approx(r[1].loss, rel=1e-4, abs=1e-6)
    wt, wm = tb.hf_state_dict(), mb.hf_state_dict()
    assert any(not torch.equal(wt[k], TorchBackend.from_config(cfg, seed=4).hf_state_dict()[k]) for k in wm)
    # Adam divides by sqrt(v): where a gradient is near zero, float rounding between the two backends is
    # amplified up to a fraction of lr, so the bound is relative to lr (1e-2), not to float precision.
    for k in wm:
        torch.testing.assert_close(wm[k], wt[k], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_a_step_counts_samples_not_rows(cfg, packed: bool) -> None:  # type: ignore[no-untyped-def]
    samples = []
    for i, adv in enumerate([0.8, -0.5, 1.2]):
        samples += execution_samples(f"e{i}", PathSampler(5).sample(random_tree(i, f"e{i}"), random.Random(i)), adv)
    mbs = pack_samples(samples, 200, packed=packed)
    result = Learner(build_backend("torch", cfg, seed=3), GRPO()).step(mbs)
    assert result.n_samples == len(samples) and result.micro_steps == len(mbs)


@pytest.mark.parametrize("algo", [GRPO(), GSPO(eps_low=0.05, eps_high=0.05), SFT()], ids=lambda a: a.name)
def test_packed_rows_give_the_padded_loss_and_gradients_on_both_backends(cfg, algo: Algorithm) -> None:  # type: ignore[no-untyped-def]
    samples = []
    for i, adv in enumerate([0.8, -0.5, 1.2]):
        drawn = PathSampler(5).sample(random_tree(i, f"e{i}"), random.Random(i))
        samples += execution_samples(f"e{i}", drawn, adv, 1 / 3)
    padded = pack_samples(samples, 96)
    packed = pack_samples(samples, 200, packed=True)
    assert any(m.input_ids.shape[0] < len(m.execution_ids) for m in packed)  # rows really are shared
    tb = build_backend("torch", cfg, seed=3)
    mb = build_backend("megatron", cfg, tb.hf_state_dict())
    results = {}
    for name, backend, mbs in (("padded", tb, padded), ("packed", tb, packed), ("megatron-packed", mb, packed)):
        learner = Learner(backend, algo)
        backend.zero_grad()
        loss = sum(learner.accumulate(m).loss for m in mbs)
        results[name] = (loss, backend.hf_grads())
        backend.zero_grad()
    ref_loss, ref_grads = results["padded"]
    for name in ("packed", "megatron-packed"):
        loss, grads = results[name]
        assert loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-7), name
        for k in ref_grads:
            torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["torch", "megatron"])
def test_a_non_finite_gradient_skips_the_update(cfg, kind: str) -> None:  # type: ignore[no-untyped-def]
    backend = build_backend(kind, cfg, seed=5)
    learner = Learner(backend, GRPO(), lr=1e-2)
    before = {k: v.clone() for k, v in backend.hf_state_dict().items()}
    poisoned = batches()
    poisoned[0].advantages[poisoned[0].mask] = float("nan")
    result = learner.step(poisoned)
    assert result.grad_norm != result.grad_norm  # NaN: reported, not hidden
    after = backend.hf_state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)  # the weights are untouched
    result = learner.step(batches())  # the next, healthy batch trains as usual
    assert result.grad_norm > 0 and result.grad_norm == result.grad_norm
    assert any(not torch.equal(backend.hf_state_dict()[k], before[k]) for k in before)
