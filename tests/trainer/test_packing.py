"""Samples refuse parts that do not line up; packing aligns targets, logprobs and weights to predictions."""

from __future__ import annotations

import math

import pytest
import torch

from opengyre.trainer import PAD_ID, SampleError, TrainingSample, pack_samples


def sample(n: int, eid: str = "e", **kw: object) -> TrainingSample:
    base: dict[str, object] = dict(
        execution_id=eid,
        leaf="l",
        tokens=tuple(range(10, 10 + n)),
        targets=tuple(i >= n // 2 for i in range(n)),
        behaviour_logprobs=tuple(-0.1 * i if i >= n // 2 else 0.0 for i in range(n)),
        advantage=0.5,
        token_weight=0.01,
        temperatures=(1.0,) * n,
    )
    base.update(kw)
    return TrainingSample(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "bad",
    [
        {"targets": (False, True)},  # 2 flags for 6 tokens
        {"behaviour_logprobs": (0.0,) * 5},
        {"weight_versions": ("v",) * 3},
        {"targets": (True, False, False, True, True, True)},  # position 0 has no prediction
        {"tokens": (1, 2, -3, 4, 5, 6)},
        {"behaviour_logprobs": (0.0, 0.0, 0.0, 0.5, -0.1, -0.1)},  # a probability above 1
        {"behaviour_logprobs": (0.0, 0.0, 0.0, math.nan, -0.1, -0.1)},
        {"advantage": math.inf},
        {"token_weight": -1.0},
        {"tokens": (1,), "targets": (False,), "behaviour_logprobs": (0.0,)},
    ],
)
def test_mismatched_or_corrupt_samples_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(SampleError):
        sample(6, **bad)


def test_packing_aligns_targets_to_predictions() -> None:
    samples = [sample(6, "a"), sample(9, "b"), sample(4, "c")]
    mbs = pack_samples(samples, max_tokens=18)  # 2 rows of 9 fit; the third row goes to the next micro-batch
    assert [m.execution_ids for m in mbs] == [("b", "a"), ("c",)]
    first = mbs[0]
    assert first.input_ids.shape == (2, 9) and first.padded_tokens == 18 and first.n_tokens == 15
    assert first.input_ids[1, 6:].tolist() == [PAD_ID] * 3
    a = samples[0]
    # column t predicts token t + 1: the mask, the behaviour logprobs and the weights all shift by one
    assert first.mask[1].tolist() == [*a.targets[1:], False, False, False]
    torch.testing.assert_close(first.behaviour_logprobs[1, :5], torch.tensor(a.behaviour_logprobs[1:]))
    assert first.token_weights[1].tolist() == pytest.approx([0.01 if m else 0.0 for m in first.mask[1].tolist()])
    assert sum(m.n_targets for m in mbs) == sum(s.n_targets for s in samples)
    assert first.advantages[1].tolist() == [0.5] * 5 + [0.0] * 3  # each column carries its sample's advantage


def test_a_sample_longer_than_the_budget_still_packs_alone() -> None:
    [mb] = pack_samples([sample(50)], max_tokens=8)
    assert mb.input_ids.shape == (1, 50)


def test_packed_rows_share_rows_with_restarting_positions_and_block_attention() -> None:
    a, b, c = sample(6, "a"), sample(4, "b"), sample(2, "c")
    [mb] = pack_samples([b, a, c], max_tokens=100, packed=True)
    # rows as long as the longest sample (6): a fills row 0, b and c share row 1
    assert mb.input_ids.shape == (2, 6) and mb.execution_ids == ("a", "b", "c")
    assert mb.position_ids is not None
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 0, 1]]
    assert mb.segments()[1].tolist() == [1, 1, 1, 1, 2, 2]
    blocked = mb.attention_blocked()
    assert blocked is not None and blocked.shape == (2, 1, 6, 6)
    allowed = ~blocked[1, 0]
    assert allowed[5].tolist() == [False, False, False, False, True, True]  # c's last token sees only c
    assert allowed[3].tolist() == [True, True, True, True, False, False]  # b's last token sees b, causally
    # column 3 of row 1 would predict c's first token from b's last: never a target
    assert mb.mask[1].tolist() == [*b.targets[1:], False, *c.targets[1:]]
    assert mb.n_targets == a.n_targets + b.n_targets + c.n_targets and mb.padded_tokens == 12
