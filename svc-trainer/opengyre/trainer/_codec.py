"""Token ids and logprobs as compact little-endian bytes, version spans as compact JSON, in the trainer's
tables (deterministic for rebuilds)."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

__all__ = ["decode_floats", "decode_ids", "decode_spans", "encode_floats", "encode_ids", "encode_spans"]


def encode_ids(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def decode_ids(raw: bytes) -> tuple[int, ...]:
    return tuple(int(x) for x in np.frombuffer(raw, dtype="<i4"))


def encode_floats(xs: Sequence[float]) -> bytes:
    return np.asarray(xs, dtype="<f4").tobytes()


def decode_floats(raw: bytes) -> tuple[float, ...]:
    return tuple(float(x) for x in np.frombuffer(raw, dtype="<f4"))


def encode_spans(spans: Sequence[tuple[str, int, int]]) -> str:
    return json.dumps([list(x) for x in spans], separators=(",", ":")) if spans else ""


def decode_spans(raw: str) -> tuple[tuple[str, int, int], ...]:
    return tuple((str(v), int(a), int(b)) for v, a, b in json.loads(raw)) if raw else ()
