"""The engine's KV-cached forward computes what the trainer computes, batched or not, with or without reuse."""

from __future__ import annotations

import torch

from opengyre.models import build_model, model_config, token_logprobs
from opengyre.proxy.engine._prefix_cache import PrefixCache
from opengyre.proxy.engine._runner import ModelRunner


def _ids(n: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 288, (n,), generator=g).tolist()


def test_chunked_prefill_and_decode_give_the_trainers_logprobs() -> None:
    model = build_model(model_config("tiny"), seed=3)
    runner = ModelRunner(model)
    ids = _ids(120)
    ref = token_logprobs(model, torch.tensor([ids]))[0]
    cache = runner.new_cache()
    logits = [runner.prefill(cache, ids[:50], all_logits=True), runner.prefill(cache, ids[50:90], all_logits=True)]
    logits += [runner.decode([cache], [t]) for t in ids[90:]]
    lp = torch.log_softmax(torch.cat(logits)[:-1], -1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    assert cache.length == len(ids)
    assert torch.allclose(lp, ref, atol=1e-5)


def test_a_batched_decode_step_equals_separate_ones() -> None:
    runner = ModelRunner(build_model(model_config("tiny"), seed=1))
    a, b = _ids(40, 1), _ids(70, 2)
    solo = []
    for ids in (a, b):
        c = runner.new_cache()
        runner.prefill(c, ids)
        solo.append(runner.decode([c], [5]))
    ca, cb = runner.new_cache(), runner.new_cache()
    runner.prefill(ca, a)
    runner.prefill(cb, b)
    both = runner.decode([ca, cb], [5, 5])
    assert torch.allclose(both[0], solo[0][0], atol=1e-5)
    assert torch.allclose(both[1], solo[1][0], atol=1e-5)


def test_a_prefix_cache_hit_computes_the_same_logits() -> None:
    runner = ModelRunner(build_model(model_config("tiny"), seed=2))
    first = _ids(64, 3)
    cache = runner.new_cache()
    runner.prefill(cache, first)
    pc = PrefixCache(max_tokens=10_000)
    pc.insert(first, cache)
    second = [*first[:50], *_ids(20, 4)]
    hit, reused = pc.lookup(second)
    assert hit == 50 and reused is not None and reused.length == 50
    warm = runner.prefill(reused, second[50:])
    cold_cache = runner.new_cache()
    cold = runner.prefill(cold_cache, second)
    assert torch.allclose(warm, cold, atol=1e-5)
    assert pc.lookup(_ids(30, 9)) == (0, None)  # nothing shared: no reuse
