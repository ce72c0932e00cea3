"""Decoupled PPO: proximal logprobs from the step start, mini-batch updates, a clip that acts.

The first update of a step has every ratio at 1; from the second on the policy has moved and the clip acts.
A small case is recomputed by hand: the first update with autograd and AdamW directly, then the second
mini-batch's ratios against the step-start logprobs, and the clip fraction from them.
"""

from __future__ import annotations

import random

import pytest
import torch

from opengyre.models import model_config, target_logprobs
from opengyre.trainer import Learner, MiniBatch, PathSampler, TrainerConfig, execution_samples, pack_samples
from opengyre.trainer.algorithms import GRPO, GSPO, Algorithm
from opengyre.trainer.backends import TorchBackend, build_backend

from .test_backends import random_tree

EPS = 0.2


def minibatch(seed: int, advantage: float) -> MiniBatch:
    eid = f"e{seed}"
    drawn = PathSampler(5).sample(random_tree(seed, eid), random.Random(seed))
    [mb] = pack_samples(execution_samples(eid, drawn, advantage), 100_000)
    return MiniBatch([mb], 1.0)  # one execution, its token weights sum to 1


def test_the_second_update_clips_against_the_step_start_logprobs() -> None:
    first, second = minibatch(0, 1.0), minibatch(1, 1.0)  # behaviour logprobs far from the model's: stale data
    backend = build_backend("torch", model_config("tiny"), seed=4)
    initial = backend.hf_state_dict()
    learner = Learner(backend, GRPO(eps_low=EPS, eps_high=EPS, tis_cap=2.0), lr=0.05, max_grad_norm=None)
    result = learner.step([first, second])
    assert result.updates == 2

    # By hand: the step-start logprobs, the first update (ratio 1), then the second mini-batch's ratios.
    hand = TorchBackend.from_config(model_config("tiny"))
    hand.load_hf_state_dict(initial)
    mb1, mb2 = first.micro_batches[0], second.micro_batches[0]
    with torch.no_grad():
        prox1, prox2 = hand.token_logprobs(mb1), hand.token_logprobs(mb2)
    lp = hand.token_logprobs(mb1)
    tis = torch.exp(prox1 - mb1.behaviour_logprobs).clamp(max=2.0)
    per_token = -(torch.exp(lp - prox1) * mb1.advantages) * tis  # r = 1 exactly: the unclipped term
    loss = torch.where(mb1.mask, per_token * mb1.token_weights, torch.zeros_like(lp)).sum()
    loss.backward()  # type: ignore[no-untyped-call]
    opt = torch.optim.AdamW(hand.parameters(), lr=0.05, weight_decay=0.0, betas=(0.9, 0.999))
    opt.step()
    with torch.no_grad():
        ratio = torch.exp(hand.token_logprobs(mb2) - prox2)
    adv = mb2.advantages
    clipped = mb2.mask & (((adv > 0) & (ratio > 1 + EPS)) | ((adv < 0) & (ratio < 1 - EPS)))
    n1, n2 = mb1.n_targets, mb2.n_targets
    by_hand = int(clipped.sum()) / n2
    assert by_hand > 0.1  # the policy moved: a real share of the second mini-batch is clipped
    # The step's metric: target-weighted over its two updates, the first of which clips nothing.
    assert result.metrics["clip_fraction"] == pytest.approx(by_hand * n2 / (n1 + n2), abs=1e-9)


def gradients(algorithm: Algorithm, first: MiniBatch, second: MiniBatch) -> tuple[dict[str, torch.Tensor], ...]:
    """The gradient of each of the two updates of a step (the first applied before the second is taken)."""
    backend = build_backend("torch", model_config("tiny"), seed=4)
    learner = Learner(backend, algorithm, lr=0.05, max_grad_norm=None)
    mb1, mb2 = first.micro_batches[0], second.micro_batches[0]
    prox1, prox2 = learner.proximal(mb1), learner.proximal(mb2)
    learner.accumulate(mb1, prox1)
    g1 = backend.hf_grads()
    learner.apply()
    learner.accumulate(mb2, prox2)
    return g1, backend.hf_grads()


def on_policy(mb: MiniBatch) -> MiniBatch:
    """The same data with behaviour logprobs equal to the step-start policy's (no importance correction)."""
    backend = build_backend("torch", model_config("tiny"), seed=4)
    [micro] = mb.micro_batches
    with torch.no_grad():
        micro.behaviour_logprobs = torch.where(micro.mask, backend.token_logprobs(micro), 0.0)
    return mb


def test_grpo_and_gspo_gradients_agree_at_ratio_one_and_differ_after_an_update() -> None:
    first, second = on_policy(minibatch(0, 1.0)), on_policy(minibatch(1, -1.0))
    grpo = gradients(GRPO(), first, second)
    gspo = gradients(GSPO(), first, second)
    # First update: every ratio is 1 and nothing is clipped, so the token-level and sequence-level
    # objectives have the same gradient.
    for k in grpo[0]:
        torch.testing.assert_close(grpo[0][k], gspo[0][k], rtol=1e-4, atol=1e-7)
    # Second update: the ratios moved; GRPO clips token by token, GSPO by the sequence's geometric mean.
    diff = sum(float((grpo[1][k] - gspo[1][k]).abs().sum()) for k in grpo[1])
    size = sum(float(grpo[1][k].abs().sum()) for k in grpo[1])
    assert diff > 0.05 * size


def test_temperature_scaled_logprobs_are_the_engines_rule() -> None:
    # target_logprobs divides the logits by the temperature before log_softmax, as the engine's sampler does
    logits = torch.randn(2, 5, 11)
    targets = torch.randint(0, 11, (2, 5))
    t = torch.full((2, 5), 0.7)
    lp, ent = target_logprobs(logits, targets, t, entropy=True)
    want = torch.log_softmax(logits / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(lp, want)
    p = torch.softmax(logits / 0.7, -1)
    assert ent is not None
    torch.testing.assert_close(ent, -(p * p.log()).sum(-1))


def test_the_default_objective_clips_on_a_fixed_off_policy_batch() -> None:
    """16 executions (the default step: one group of 16) with behaviour logprobs far from the model's, trained
    with every default: algorithm, lr, mini-batches and epochs. One epoch over 4 mini-batches (the old
    default) clips little or nothing at lr 1e-5; the second epoch finds the sequences past GSPO's bounds."""
    from opengyre.trainer import plan_minibatches
    from opengyre.trainer.algorithms import get_algorithm

    cfg = TrainerConfig()
    samples = []
    for i in range(cfg.group_size):
        eid = f"e{i}"
        drawn = PathSampler(5).sample(random_tree(i, eid), random.Random(i))
        samples += execution_samples(eid, drawn, 1.0 if i % 2 else -1.0, 1.0 / sum(p.n_targets for p in drawn))

    def clip_fraction(epochs: int) -> float:
        backend = build_backend("torch", model_config(cfg.model), seed=cfg.seed)
        learner = Learner(backend, get_algorithm(cfg.algorithm), lr=cfg.lr, max_grad_norm=cfg.max_grad_norm)
        plan = plan_minibatches(
            samples, mini_batches=cfg.mini_batches, aggregation=cfg.aggregation, norm_tokens=None,  # type: ignore[arg-type]
            micro_batch_tokens=cfg.micro_batch_tokens, packed=False, seed=cfg.seed, step=1,
        )  # fmt: skip
        result = learner.step(plan, epochs)
        assert result.updates == cfg.mini_batches * epochs
        return result.metrics["clip_fraction"]

    two, one = clip_fraction(cfg.ppo_epochs), clip_fraction(1)
    assert two > 0.1 and two > 3 * one  # one epoch (the old default) leaves the clip all but idle


def test_the_run_configuration_caps_staleness_and_splits_steps_by_default() -> None:
    cfg = TrainerConfig()
    assert cfg.max_staleness == 1  # the scheduler's default bound (phi = 1)
    assert cfg.mini_batches > 1  # more than one update per step: the clip can act
    with pytest.raises(ValueError, match="mini_batches = 1"):
        TrainerConfig(streaming=True).validate()
