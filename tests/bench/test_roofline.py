"""Roofline figures against hand computation and published model sizes."""

from __future__ import annotations

import pytest

from opengyre.bench import ConfigError, ModelShape, capacity, hardware, phase_roofline

from ._configs import GPT_OSS_20B, LLAMA_31_8B, LLAMA_31_70B, QWEN3_30B_A3B

SMALL = {
    "hidden_size": 8,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 4,
    "intermediate_size": 16,
    "vocab_size": 32,
}


def test_h100_ridge_is_295() -> None:
    assert round(hardware("H100").ridge) == 295
    assert hardware("h100") is hardware("H100")
    with pytest.raises(KeyError, match="known: H100"):
        hardware("TPUv9")


def test_small_config_prefill_by_hand() -> None:
    s = ModelShape.from_config(SMALL)
    r = phase_roofline(s, hardware("H100"), "prefill", requests=1, new_tokens=3, context=0)
    c = r.components
    # QKV out width (2 + 2·1)·4 = 16. QKV: 2·3·8·16 = 768, O: 2·3·8·8 = 384.
    assert c["qkv_o"].flops == 1152
    # weights 8·4·(2·2 + 2·1) = 192 params · 2 B; activations 3 tokens · (8 in + 16 qkv + 8 o-in + 8 out) · 2 B
    assert c["qkv_o"].bytes == 384 + 240
    # gate, up, down: 2·3·3·8·16
    assert c["mlp"].flops == 2304
    assert c["mlp"].bytes == 768 + 3 * (8 + 48 + 8) * 2
    # causal spans 1+2+3 = 6 keys: QK^T and PV 4·2 heads·4·6 = 192, softmax 5·2·6 = 60
    assert c["attention"].flops == 252
    # K,V of 3 tokens read + written: 2·1·4·6·2 B; Q read, O written: 2·3·2·4·2 B
    assert c["attention"].bytes == 96 + 96
    assert c["qkv_o"].oi == pytest.approx(1152 / 624)


def test_small_config_decode_reads_cached_kv_of_kv_heads() -> None:
    s = ModelShape.from_config(SMALL)
    r = phase_roofline(s, hardware("H100"), "decode", requests=2, new_tokens=1, context=9)
    att = r.components["attention"]
    # each request: 10 keys, 2 heads: 4·2·4·10 + 5·2·10; bytes: K,V of 1 KV head over 10 read + 1 written, q/o
    assert att.flops == 2 * (320 + 100)
    assert att.bytes == 2 * (2 * 1 * 4 * 11 * 2 + 2 * 1 * 2 * 4 * 2)


def test_llama_parameter_counts_match_published() -> None:
    assert ModelShape.from_config(LLAMA_31_8B).params == 8_030_261_248
    assert ModelShape.from_config(LLAMA_31_70B).params == 70_553_706_496


def test_llama_kv_uses_kv_heads_not_attention_heads() -> None:
    s8 = ModelShape.from_config(LLAMA_31_8B)
    assert s8.kv_bytes(1) == 2 * 32 * 8 * 128 * 2  # 128 KiB per token, not 4x that (32 attention heads)
    assert ModelShape.from_config(LLAMA_31_70B).kv_bytes(1) == 2 * 80 * 8 * 128 * 2


def test_llama_8b_capacity_wall_at_32k_on_h100() -> None:
    cap = capacity(ModelShape.from_config(LLAMA_31_8B), hardware("H100"), context=32768)
    # (80e9 - 8,030,261,248·2) / (32768 · 131072) = 14.89: 14 fit, the 15th crosses (the paper: C≈14)
    assert cap.max_concurrency == 14
    assert cap.wall == 15
    assert cap.footprint(15) > 80e9 > cap.footprint(14)
    half = capacity(ModelShape.from_config(LLAMA_31_8B), hardware("H100"), context=32768, memory_utilisation=0.9)
    assert half.max_concurrency == int((72e9 - 2 * 8_030_261_248) // (32768 * 131072))


def test_70b_needs_tensor_parallel_and_kv_heads_are_not_split_below_one() -> None:
    s = ModelShape.from_config(LLAMA_31_70B)
    assert capacity(s, hardware("H100"), context=8192).max_concurrency == 0  # 141 GB of weights
    tp4 = capacity(s, hardware("H100"), context=8192, tp=4)
    assert tp4.kv_per_request_per_gpu == s.kv_bytes(8192) / 4
    tp16 = capacity(s, hardware("H100"), context=8192, tp=16)
    assert tp16.kv_per_request_per_gpu == s.kv_bytes(8192) / 8  # 8 KV heads: one per rank at best
    for tp in (3, 12):  # neither divides the 64 attention heads: refused, never modelled as an uneven split
        with pytest.raises(ValueError, match=f"tensor-parallel degree of {tp}"):
            capacity(s, hardware("H100"), context=8192, tp=tp)
    with pytest.raises(ValueError, match="cannot shard the 8 KV heads"):
        capacity(
            ModelShape.from_config({**LLAMA_31_70B, "num_attention_heads": 96, "head_dim": 128}),
            hardware("H100"),
            context=8,
            tp=12,
        )


def test_prefill_projection_oi_grows_with_input_length_and_decode_is_memory_bound() -> None:
    s = ModelShape.from_config(LLAMA_31_8B)
    h100 = hardware("H100")
    chat = phase_roofline(s, h100, "prefill", requests=1, new_tokens=187, context=0)
    coding = phase_roofline(s, h100, "prefill", requests=1, new_tokens=9995, context=0)
    decode = phase_roofline(s, h100, "decode", requests=64, new_tokens=1, context=10000)
    # MLP GEMM: 2·T·3·h·I / (3hI + T(2h+3I))·2 B, by hand for T = 9995
    t, h, i = 9995, 4096, 14336
    assert coding.components["mlp"].oi == pytest.approx(2 * t * 3 * h * i / ((3 * h * i + t * (2 * h + 3 * i)) * 2))
    assert chat.bound("mlp") == "memory" and coding.bound("mlp") == "compute"
    assert all(decode.bound(n) == "memory" for n in decode.components)
    assert coding.bound("attention") == "memory" or coding.components["attention"].oi < 4 * 32 * 128


def test_moe_counts_active_experts_and_sliding_windows() -> None:
    q = ModelShape.from_config(QWEN3_30B_A3B)
    # published 30,532,122,624 includes per-head q/k norms (2·128·48) this model does not count
    assert q.params == 30_532_122_624 - 2 * 128 * 48
    one = phase_roofline(q, hardware("H100"), "decode", requests=1, new_tokens=1, context=0)
    # one token: router 2·2048·128 + 8 experts · 2·3·2048·768, per layer
    assert one.components["mlp"].flops == 48 * (2 * 2048 * 128 + 8 * 2 * 3 * 2048 * 768)
    g = ModelShape.from_config(GPT_OSS_20B)
    per = 2 * 8 * 64 * 2
    assert g.kv_bytes(1000) == 12 * per * 1000 + 12 * per * 128


@pytest.mark.parametrize(
    ("drop", "msg"),
    [("num_key_value_heads", "num_key_value_heads"), ("hidden_size", "hidden_size"), ("vocab_size", "vocab_size")],
)
def test_missing_fields_are_named(drop: str, msg: str) -> None:
    cfg = {k: v for k, v in LLAMA_31_8B.items() if k != drop}
    with pytest.raises(ConfigError, match=msg):
        ModelShape.from_config(cfg)


def test_moe_without_experts_per_token_and_bad_values_are_refused() -> None:
    cfg = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts_per_tok"}
    with pytest.raises(ConfigError, match="num_experts_per_tok or experts_per_token"):
        ModelShape.from_config(cfg)
    with pytest.raises(ConfigError, match="positive integer"):
        ModelShape.from_config({**LLAMA_31_8B, "hidden_size": "4096"})
    with pytest.raises(ConfigError, match="JSON object"):
        ModelShape.from_config([1, 2])  # type: ignore[arg-type]
