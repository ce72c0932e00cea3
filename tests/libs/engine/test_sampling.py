"""SGLang's sampling_params contract: unknown keys are refused; greedy, seeds, top-k and bias behave."""

from __future__ import annotations

import pytest
import torch

from opengyre.engine import SamplingError, SamplingParams
from opengyre.engine._sampling import sample_next


@pytest.mark.parametrize(
    "raw",
    [
        {"bogus": 1},
        {"ebnf": "root ::= 'a'"},
        {"regex": "("},
        {"regex": "a", "json_schema": "{}"},
        {"json_schema": '{"$ref": "#/x"}'},
        {"n": 2},
        {"temperature": -1},
        {"top_p": 0},
        {"top_k": 0},
        {"max_new_tokens": "5"},
        {"stop": [1]},
        {"stop_token_ids": [999]},
        {"logit_bias": {"x": 1}},
        "not an object",
    ],
)
def test_bad_sampling_params_are_refused(raw: object) -> None:
    with pytest.raises(SamplingError):
        SamplingParams.parse(raw, 288)


def test_known_params_parse() -> None:
    p = SamplingParams.parse(
        {
            "max_new_tokens": 7,
            "temperature": 0,
            "stop": "x",
            "stop_token_ids": [258],
            "regex": None,
            "no_stop_trim": True,
        },
        288,
    )
    assert (p.max_new_tokens, p.greedy, p.stop, p.stop_token_ids, p.no_stop_trim) == (7, True, ("x",), {258}, True)


def test_greedy_picks_the_argmax_and_reports_its_logprob() -> None:
    logits = torch.randn(288, generator=torch.Generator().manual_seed(0))
    tok, lps = sample_next(logits, SamplingParams(temperature=0.0), None, counts=None, ban=frozenset())
    assert tok == int(logits.argmax())
    assert float(lps[tok]) == pytest.approx(float(torch.log_softmax(logits, -1)[tok]))


def test_seeded_sampling_repeats_and_top_k_one_is_greedy() -> None:
    logits = torch.randn(288, generator=torch.Generator().manual_seed(1))
    p = SamplingParams(temperature=1.0)
    draws = [
        [sample_next(logits, p, g, counts=None, ban=frozenset())[0] for _ in range(20)]
        for g in (torch.Generator().manual_seed(5), torch.Generator().manual_seed(5))
    ]
    assert draws[0] == draws[1] and len(set(draws[0])) > 1
    tok, _ = sample_next(logits, SamplingParams(top_k=1), torch.Generator(), counts=None, ban=frozenset())
    assert tok == int(logits.argmax())


def test_logit_bias_and_bans_steer_the_choice() -> None:
    logits = torch.zeros(288)
    tok, _ = sample_next(
        logits, SamplingParams(temperature=0.0, logit_bias={42: 5.0}), None, counts=None, ban=frozenset()
    )
    assert tok == 42
    tok, _ = sample_next(
        logits, SamplingParams(temperature=0.0, logit_bias={42: 5.0}), None, counts=None, ban=frozenset({42})
    )
    assert tok != 42
