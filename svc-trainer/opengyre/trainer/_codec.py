"""Token ids and logprobs as compact little-endian bytes in the trainer's tables (deterministic for rebuilds)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["decode_floats", "decode_ids", "encode_floats", "encode_ids"]


def encode_ids(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def decode_ids(raw: bytes) -> tuple[int, ...]:
    return tuple(int(x) for x in np.frombuffer(raw, dtype="<i4"))


def encode_floats(xs: Sequence[float]) -> bytes:
    return np.asarray(xs, dtype="<f4").tobytes()


def decode_floats(raw: bytes) -> tuple[float, ...]:
    return tuple(float(x) for x in np.frombuffer(raw, dtype="<f4"))
