"""The token payload codec: exact round trips, varint ids, float32 logprobs, refusal of damaged bytes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opengyre.events import ModelCallRecorded
from opengyre.trajectory import (
    PayloadError,
    TokenPayload,
    TrajectoryError,
    TrajectoryTree,
    decode_payload,
    encode_payload,
    join_payload,
    payload_digest,
    split_payload,
)
from opengyre.trajectory._payload import _decode_varints, _encode_varints

f32 = st.floats(max_value=0.0, allow_nan=False, allow_infinity=False, width=32)
ids = st.lists(st.integers(0, 2**32 - 1), max_size=300)
contexts = st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=30) | st.integers(), max_size=4)


@settings(max_examples=150, deadline=None)
@given(prompt=ids, data=st.data(), context=contexts)
def test_a_payload_round_trips_exactly(
    prompt: list[int], data: st.DataObject, context: dict[str, object] | None
) -> None:
    output = data.draw(ids)
    logprobs = data.draw(st.lists(f32, min_size=len(output), max_size=len(output)))
    p = TokenPayload(prompt, output, logprobs, context)
    raw = encode_payload(p)
    back = decode_payload(raw)
    assert (list(back.prompt_delta_ids), list(back.output_ids), list(back.output_logprobs), back.context) == (
        prompt,
        output,
        logprobs,
        context,
    )
    assert encode_payload(p) == raw  # deterministic: one content, one digest
    assert decode_payload(raw, context=False).context is None


def test_ids_are_varints_and_logprobs_float32() -> None:
    rng = np.random.default_rng(0)
    low = encode_payload(TokenPayload(rng.integers(0, 128, 200).tolist(), [5, 6], [-0.5, -1.25]))
    high = encode_payload(TokenPayload(rng.integers(16_384, 2**21, 200).tolist(), [5, 6], [-0.5, -1.25]))
    assert low[4] == high[4] == 0  # random ids: not compressed
    # One byte per id below 128, three below 2**21 (a 151k vocabulary's ids all are), 4 bytes per logprob.
    assert len(high) - len(low) == 2 * 200
    # magic + version, flags, header (200: 2 bytes, 2: 1, 202: 2, 0: 1), 202 one-byte ids, 2 float32
    assert len(low) == 4 + 1 + 6 + 202 + 2 * 4
    lp = decode_payload(encode_payload(TokenPayload([], [1], [-0.1]))).output_logprobs[0]
    assert lp == float(np.float32(-0.1)) and lp != -0.1  # float32, as the trainer computes in


def test_a_compressible_context_is_compressed() -> None:
    text = "line of output from a tool run\n" * 200
    p = TokenPayload([1, 2], [3], [-0.5], {"messages": [{"role": "tool", "content": text}]})
    raw = encode_payload(p)
    assert len(raw) < len(text) // 4 and decode_payload(raw) == TokenPayload([1, 2], [3], [-0.5], p.context)


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"XXXX\x00\x00\x00\x00\x00",
        b"OGP\x02\x00\x00\x00\x00\x00",  # a newer version
        b"OGP\x01\x04\x00\x00\x00\x00",  # unknown flags
        b"OGP\x01\x00\x02\x00\x02\x00\x05",  # header says 2 ids in 2 bytes, body has 1 byte
        b"OGP\x01\x00\x02\x00\x02\x00\x85\x05",  # 2 ids announced, the 2 bytes hold one (a 2-byte varint)
        b"OGP\x01\x01\x00\x00\x00\x00garbage",  # not zlib
        b"OGP\x01\x00\x00\x01\x00\x00",  # one logprob announced, none there
    ],
)
def test_damaged_bytes_are_refused(bad: bytes) -> None:
    with pytest.raises(PayloadError):
        decode_payload(bad)


def test_ids_outside_uint32_and_mismatched_logprobs_are_refused() -> None:
    with pytest.raises(PayloadError):
        encode_payload(TokenPayload([-1], [], []))
    with pytest.raises(PayloadError):
        encode_payload(TokenPayload([2**32], [], []))
    with pytest.raises(PayloadError):
        encode_payload(TokenPayload([], [1, 2], [-0.1]))


def test_split_and_join_give_back_the_call_and_refuse_another_payload() -> None:
    e = ModelCallRecorded(
        execution_id="e1",
        call_id="c1",
        prompt_delta_ids=[1, 2, 3],
        output_ids=[4, 5],
        output_logprobs=[-0.5, -0.25],
        context={"base": 0, "messages": [{"role": "user", "content": "hi"}]},
    )
    slim, raw = split_payload(e)
    assert slim.payload is not None and slim.payload.digest == payload_digest(raw) and slim.payload.size == len(raw)
    assert (slim.prompt_delta_ids, slim.output_ids, slim.context, slim.n_prompt_delta, slim.n_output) == (
        [],
        [],
        None,
        3,
        2,
    )
    with pytest.raises(TrajectoryError, match="join them first"):
        TrajectoryTree("e1", [slim])
    whole = join_payload(slim, raw)
    assert whole == ModelCallRecorded(**{**{f: getattr(e, f) for f in e.__struct_fields__}, "payload": slim.payload})
    assert TrajectoryTree("e1", [whole]).tokens("c1") == (1, 2, 3, 4, 5)
    _, other = split_payload(ModelCallRecorded(execution_id="e1", call_id="c2", output_ids=[9], output_logprobs=[0.0]))
    with pytest.raises(PayloadError, match="digest"):
        join_payload(slim, other)


@pytest.mark.parametrize("n", [0, 1, 511, 512, 513, 3000])
def test_short_and_long_id_lists_are_encoded_alike(n: int) -> None:
    # Two encoders (a loop up to _SHORT ids, vectorised past it) write the same varints: one content, one digest.
    rng = np.random.default_rng(n)
    edges = [0, 127, 128, 16_383, 16_384, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**32 - 1]
    for high in (128, 300, 151_643, 2**32):
        ids = [*edges, *rng.integers(0, high, n).tolist()][:n]
        want = b"".join(_varint(i) for i in ids)
        assert _encode_varints(ids) == want
        assert _decode_varints(want, len(ids)).tolist() == ids


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        byte, v = v & 0x7F, v >> 7
        out.append(byte | (0x80 if v else 0))
        if not v:
            return bytes(out)
