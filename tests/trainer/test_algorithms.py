"""Loss modules against hand-computed values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from opengyre.trainer.algorithms import DAPO, GRPO, GSPO, SFT, LossInputs, get_algorithm, group_advantages, k3

LOGP = [-1.0, -2.0, -0.5]
OLD = [-1.0, -1.5, -0.9]
W = [0.2, 0.3, 0.5]


def inputs(adv: float, behaviour: list[float] | None = None, mask: list[bool] | None = None) -> LossInputs:
    logp = torch.tensor([LOGP], requires_grad=True)
    return LossInputs(
        logprobs=logp,
        old_logprobs=torch.tensor([OLD]),
        behaviour_logprobs=torch.tensor([behaviour or OLD]),
        advantages=torch.tensor([adv]),
        mask=torch.tensor([mask or [True, True, True]]),
        token_weights=torch.tensor([W]),
    )


def test_grpo_token_clipping_positive_advantage() -> None:
    x = inputs(1.0)
    out = GRPO(eps_low=0.2, eps_high=0.28, tis_cap=None).loss(x)
    r1, r2 = math.exp(-0.5), math.exp(0.4)
    assert float(out.loss.detach()) == pytest.approx(-(0.2 * 1.0 + 0.3 * r1 + 0.5 * min(r2, 1.28)))
    out.loss.backward()
    assert x.logprobs.grad is not None
    assert x.logprobs.grad[0].tolist() == pytest.approx([-0.2, -0.3 * r1, 0.0])  # clipped token: no gradient
    assert out.metrics["clip_fraction"] == pytest.approx(1 / 3)


def test_grpo_token_clipping_negative_advantage() -> None:
    x = inputs(-1.0)
    out = GRPO(eps_low=0.2, eps_high=0.28, tis_cap=None).loss(x)
    r1, r2 = math.exp(-0.5), math.exp(0.4)
    assert float(out.loss.detach()) == pytest.approx(0.2 + 0.3 * max(r1, 0.8) + 0.5 * r2)
    out.loss.backward()
    assert x.logprobs.grad is not None
    assert x.logprobs.grad[0].tolist() == pytest.approx([0.2, 0.0, 0.5 * r2])


def test_truncated_importance_weight_is_capped() -> None:
    beh = [OLD[0] - math.log(3.0), OLD[1] - math.log(1.5), OLD[2]]
    x = inputs(1.0, behaviour=beh)
    out = GRPO(tis_cap=2.0).loss(x)
    r1, r2 = math.exp(-0.5), math.exp(0.4)
    assert float(out.loss.detach()) == pytest.approx(-(0.2 * 1.0 * 2.0 + 0.3 * r1 * 1.5 + 0.5 * min(r2, 1.2)))


def test_gspo_sequence_ratio_and_clip() -> None:
    x = inputs(1.0)
    out = GSPO(eps_low=3e-4, eps_high=4e-4, tis_cap=None).loss(x)
    s = math.exp((0.0 - 0.5 + 0.4) / 3)
    assert float(out.loss.detach()) == pytest.approx(-s * 1.0)  # s < 1 - eps: the unclipped term is the min
    out.loss.backward()
    assert x.logprobs.grad is not None
    assert x.logprobs.grad[0].tolist() == pytest.approx([-s / 3] * 3)
    x2 = inputs(-1.0)
    out2 = GSPO(tis_cap=None).loss(x2)
    assert float(out2.loss.detach()) == pytest.approx(1 - 3e-4)  # clipped, constant: no gradient
    out2.loss.backward()
    assert x2.logprobs.grad is not None and x2.logprobs.grad.abs().sum() == 0


def test_masked_positions_never_contribute_even_if_infinite() -> None:
    x = inputs(1.0, mask=[True, False, True])
    x.token_weights = torch.tensor([[0.5, 0.0, 0.5]])
    with torch.no_grad():
        x.behaviour_logprobs[0, 1] = float("-inf")
    for algo in (GRPO(), GSPO(), SFT()):
        out = algo.loss(x)
        assert torch.isfinite(out.loss)


def test_sft_is_weighted_nll() -> None:
    x = inputs(0.0)
    assert float(SFT().loss(x).loss.detach()) == pytest.approx(0.2 * 1.0 + 0.3 * 2.0 + 0.5 * 0.5)


def test_kl_k3_is_nonnegative_and_zero_at_reference() -> None:
    lp = torch.tensor([[-1.0, -2.0]])
    mask = torch.tensor([[True, True]])
    assert k3(lp, lp, mask).abs().max() == 0
    assert (k3(lp, torch.tensor([[-0.5, -3.0]]), mask) > 0).all()
    x = inputs(1.0)
    x.ref_logprobs = torch.tensor([[-1.5, -1.5, -1.5]])
    base = float(GRPO(tis_cap=None).loss(inputs(1.0)).loss.detach())
    with_kl = GRPO(tis_cap=None, kl_beta=0.1).loss(x)
    assert float(with_kl.loss.detach()) > base and with_kl.metrics["kl"] > 0


def test_grpo_clips_symmetrically_and_dapo_clips_higher() -> None:
    # Token ratios exp(0) = 1, exp(-0.5) = 0.61, exp(0.4) = 1.49 (LOGP against OLD).
    r1, r2 = math.exp(-0.5), math.exp(0.4)
    grpo, dapo = GRPO(tis_cap=None), DAPO(tis_cap=None)
    assert (grpo.eps_low, grpo.eps_high) == (0.2, 0.2) and (dapo.eps_low, dapo.eps_high) == (0.2, 0.28)
    assert float(grpo.loss(inputs(1.0)).loss.detach()) == pytest.approx(-(0.2 + 0.3 * r1 + 0.5 * 1.2))
    assert float(dapo.loss(inputs(1.0)).loss.detach()) == pytest.approx(-(0.2 + 0.3 * r1 + 0.5 * 1.28))
    # Below 1 both clip at 1 - 0.2 (a negative advantage: the clipped 0.8 wins the max).
    for algorithm in (grpo, dapo):
        assert float(algorithm.loss(inputs(-1.0)).loss.detach()) == pytest.approx(0.2 + 0.3 * 0.8 + 0.5 * r2)
    assert DAPO.loss_aggregation == "token-mean" and DAPO.dynamic_sampling
    assert GRPO.loss_aggregation is None and GRPO.dynamic_sampling is None  # no recipe beyond the loss


def test_registry() -> None:
    assert isinstance(get_algorithm("gspo", eps_low=1e-3), GSPO)
    assert type(get_algorithm("dapo")) is DAPO and type(get_algorithm("grpo")) is GRPO
    with pytest.raises(ValueError):
        get_algorithm("ppo-magic")


def test_group_advantages_edge_cases() -> None:
    assert group_advantages([0.7]) == ([0.0], 0.7, 0.0)
    assert group_advantages([]) == ([], 0.0, 0.0)
    adv, mean, std = group_advantages([1.0, 0.0, 0.0, 1.0])
    assert mean == 0.5 and std == pytest.approx(math.sqrt(1 / 3))
    assert sum(adv) == pytest.approx(0.0)


def test_an_algorithm_declares_whether_it_needs_a_reference_policy() -> None:
    assert not get_algorithm("grpo").needs_reference and not get_algorithm("gspo").needs_reference
    assert get_algorithm("grpo", kl_beta=0.1).needs_reference and get_algorithm("gspo", kl_beta=0.1).needs_reference
    assert not get_algorithm("sft").needs_reference
