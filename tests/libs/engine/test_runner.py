"""The engine's KV-cached forward computes what the trainer computes, batched or not, with or without reuse."""

from __future__ import annotations

import pytest
import torch

from opengyre.engine._prefix_cache import PrefixCache
from opengyre.engine._runner import ModelRunner
from opengyre.models import build_model, model_config, token_logprobs


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


def test_sequences_joining_leaving_and_reordered_between_steps_decode_as_if_alone() -> None:
    """The decode batch shares one KV pool: members join, leave (their row taken by another) and come in any
    order; each sequence's logits stay those of decoding it alone."""
    model = build_model(model_config("tiny"), seed=4)
    runner, solo = ModelRunner(model), ModelRunner(model)  # the reference decodes on a pool of its own
    prompts = {name: _ids(n, seed) for name, n, seed in (("a", 30, 5), ("b", 45, 6), ("c", 12, 7), ("d", 60, 8))}
    steps = [["a", "b", "c"], ["a", "b", "c"], ["c", "a"], ["d", "c", "a"], ["a", "d"]]

    def alone(name: str, tokens: list[int]) -> torch.Tensor:
        cache = solo.new_cache()
        solo.prefill(cache, prompts[name])
        out = torch.empty(0)
        for t in tokens:
            out = solo.decode([cache], [t])[0]
        return out

    caches = {}
    for name, ids in prompts.items():
        caches[name] = runner.new_cache()
        runner.prefill(caches[name], ids)
    fed: dict[str, list[int]] = {name: [] for name in prompts}
    for k, names in enumerate(steps):
        if k == 3:
            assert [c.slot for c in (caches["a"], caches["c"])] == [0, 1]  # c took b's row; the batch was [c, a]
        if k == 2:
            runner.release(caches["b"], keep=True)  # b leaves from the middle: c's row moves into its hole
        toks = [(k * 7 + j * 3) % 288 for j in range(len(names))]
        logits = runner.decode([caches[n] for n in names], toks)
        for j, n in enumerate(names):
            fed[n].append(toks[j])
            assert caches[n].length == len(prompts[n]) + len(fed[n])
            assert torch.allclose(logits[j], alone(n, fed[n]), atol=1e-5), (k, n)
    # b kept its own copy when it left: it still continues exactly as if it had been alone.
    assert caches["b"].slot is None and caches["b"].length == len(prompts["b"]) + 2
    assert torch.allclose(runner.decode([caches["b"]], [9])[0], alone("b", [*fed["b"], 9]), atol=1e-5)


def test_prompts_prefilled_together_equal_prompts_prefilled_alone() -> None:
    """Several requests' chunks in one forward pass (one of them continuing a cached prefix): each one's last
    logits and what its cache then decodes are those of prefilling it alone."""
    runner = ModelRunner(build_model(model_config("tiny"), seed=5))
    a, b, c = _ids(33, 10), _ids(7, 11), _ids(50, 12)
    alone = []
    for ids in (a, b, c):
        cache = runner.new_cache()
        first = runner.prefill(cache, ids)
        alone.append((first, runner.decode([cache], [3])[0]))
    ca, cb, cc = runner.new_cache(), runner.new_cache(), runner.new_cache()
    runner.prefill(cc, c[:20])  # c continues a prefix already in its cache
    together = runner.prefill_many([ca, cb, cc], [a, b, c[20:]])
    assert [x.length for x in (ca, cb, cc)] == [33, 7, 50]
    after = runner.decode([ca, cb, cc], [3, 3, 3])
    for j, (first, nxt) in enumerate(alone):
        assert torch.allclose(together[j], first, atol=1e-5), j
        assert torch.allclose(after[j], nxt, atol=1e-5), j


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU has no bfloat16 GEMM in oneDNN")
def test_the_bf16_projections_run_in_bfloat16_and_stay_close_to_the_trainers_logprobs() -> None:
    """``onednn-bf16`` really computes the layers' GEMMs in bfloat16 (its logprobs differ from the float32 path by
    more than summation order does), and stays near the trainer's: what the benchmark's KL measures on SmolLM2."""
    model = build_model(model_config("tiny"), seed=6)
    ids = _ids(80, 6)
    ref = token_logprobs(model, torch.tensor([ids]))[0]
    gaps = {}
    for kernel in ("onednn", "onednn-bf16"):
        runner = ModelRunner(model, projections=kernel)
        cache = runner.new_cache()
        logits = [
            runner.prefill(cache, ids[:40]).unsqueeze(0)
        ]  # the fast kernel: prefill without prompt logprobs, then decode
        logits += [runner.decode([cache], [t]) for t in ids[40:]]
        lp = torch.log_softmax(torch.cat(logits)[:-1], -1).gather(-1, torch.tensor(ids[40:]).unsqueeze(-1)).squeeze(-1)
        gaps[kernel] = (lp - ref[39:]).abs().max().item()
    assert gaps["onednn"] < 1e-4, gaps
    assert 100 * gaps["onednn"] < gaps["onednn-bf16"] < 0.5, gaps  # bf16 rounding, far past summation order


def test_an_unknown_projection_kernel_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown projection kernel 'fp8'"):
        ModelRunner(build_model(model_config("tiny"), seed=1), projections="fp8")
