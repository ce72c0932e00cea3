"""The token payload of one model call, compactly encoded: what is stored once, by digest, out of the event.

Layout (all integers LEB128 varints unless said otherwise)::

    b"OGP" version(u8=1) flags(u8)
    n_prompt  n_output  n_id_bytes  n_context
    body            -- zlib-compressed when flags & 1
      ids           -- prompt delta ids then output ids, varints (n_id_bytes bytes)
      logprobs      -- n_output float32, little-endian
      context       -- n_context bytes of JSON (0: no context)

Token ids are varints (one byte below 128, two below 16,384, three below 2,097,152: a 151k vocabulary
needs at most three), behaviour logprobs float32 (what the trainer computes in; the engines produce float32).
The body is compressed when that makes it at least an eighth smaller (tool output and code in the context
compress well, logprobs do not). Encoding is deterministic, so a call retried with the same content gets the
same digest and is stored once.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from ._tree import TrajectoryError

__all__ = [
    "PayloadError",
    "PayloadUnavailable",
    "TokenPayload",
    "decode_payload",
    "encode_payload",
    "payload_digest",
]

_MAGIC = b"OGP\x01"
_ZLIB = 1
_LEVEL = 6
_MAX_ID = (1 << 32) - 1

_json_enc = msgspec.json.Encoder(order="sorted")
_json_dec = msgspec.json.Decoder(dict[str, Any])


class PayloadError(TrajectoryError):
    """Bytes that are not a well-formed payload (or a payload that does not match what refers to it)."""


class PayloadUnavailable(TrajectoryError):
    """A payload that cannot be read: ``reason`` is ``payload-missing``, ``payload-corrupt`` or
    ``payload-compacted`` (deleted by retention; the projections say so)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


@dataclass(frozen=True, slots=True)
class TokenPayload:
    prompt_delta_ids: Sequence[int]
    output_ids: Sequence[int]
    output_logprobs: Sequence[float]
    context: dict[str, Any] | None = None


def payload_digest(raw: bytes) -> str:
    """The content address of an encoded payload: SHA-256, hex."""
    return hashlib.sha256(raw).hexdigest()


def _varint_lengths(a: npt.NDArray[np.uint64]) -> npt.NDArray[np.int64]:
    n = np.ones(len(a), dtype=np.int64)
    for k in (7, 14, 21, 28):
        n += a >= (1 << k)
    return n


# Up to this many ids a Python loop beats the vectorised encoder (whose ~40 numpy calls cost ~50 µs however few the
# ids: most of a recorded call's payload encoding); past it the vectorised one is faster (1,000 ids: ~95 µs vs ~110).
_SHORT = 512


def _encode_varints(values: Sequence[int]) -> bytes:
    if len(values) <= _SHORT:
        return _encode_short(values)
    a = np.asarray(values, dtype=np.int64)
    if len(a) and (int(a.min()) < 0 or int(a.max()) > _MAX_ID):
        raise PayloadError("token ids must be in [0, 2**32)")
    u = a.astype(np.uint64)
    n = _varint_lengths(u)
    out = np.zeros(int(n.sum()), dtype=np.uint8)
    start = np.cumsum(n) - n
    for k in range(5):
        m = n > k
        if not m.any():
            break
        byte = ((u[m] >> np.uint64(7 * k)) & np.uint64(0x7F)).astype(np.uint8)
        byte |= (n[m] > k + 1).astype(np.uint8) << np.uint8(7)
        out[start[m] + k] = byte
    return out.tobytes()


def _encode_short(values: Sequence[int]) -> bytes:
    """``_encode_varints``'s bytes, one id at a time."""
    if values and (min(values) < 0 or max(values) > _MAX_ID):
        raise PayloadError("token ids must be in [0, 2**32)")
    out = bytearray()
    put = out.append
    for v in values:
        v = int(v)
        while v >= 0x80:
            put((v & 0x7F) | 0x80)
            v >>= 7
        put(v)
    return bytes(out)


def _decode_varints(raw: bytes, count: int) -> npt.NDArray[np.int64]:
    b = np.frombuffer(raw, dtype=np.uint8)
    if count == 0:
        if len(b):
            raise PayloadError("token id bytes without token ids")
        return np.zeros(0, dtype=np.int64)
    ends = np.flatnonzero(b < 0x80)
    if len(ends) != count or ends[-1] != len(b) - 1:
        raise PayloadError(f"expected {count} token ids, found {len(ends)}")
    starts = np.concatenate(([0], ends[:-1] + 1))
    if int((ends - starts).max()) > 4:
        raise PayloadError("a token id is longer than 5 bytes")
    group = np.repeat(np.arange(count), ends - starts + 1)
    shift = (np.arange(len(b)) - starts[group]) * 7
    parts = (b & 0x7F).astype(np.int64) << shift
    values: npt.NDArray[np.int64] = np.bitwise_or.reduceat(parts, starts)
    if int(values.max()) > _MAX_ID:
        raise PayloadError("a token id is past 2**32")
    return values


def _header_varints(values: Sequence[int]) -> bytes:
    out = bytearray()
    for v in values:
        while True:
            byte, v = v & 0x7F, v >> 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def _read_varint(raw: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(raw) or shift > 63:
            raise PayloadError("truncated payload header")
        byte = raw[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def encode_payload(p: TokenPayload, *, compress: bool = True) -> bytes:
    """The compact bytes of a call's tokens, logprobs and context (deterministic). ``compress=False`` never
    compresses (to measure what compression gives)."""
    if len(p.output_ids) != len(p.output_logprobs):
        raise PayloadError(f"{len(p.output_ids)} output ids but {len(p.output_logprobs)} logprobs")
    ids = _encode_varints([*p.prompt_delta_ids, *p.output_ids])
    lps = np.asarray(p.output_logprobs, dtype="<f4").tobytes()
    ctx = _json_enc.encode(p.context) if p.context is not None else b""
    body = ids + lps + ctx
    flags = 0
    packed = zlib.compress(body, _LEVEL) if compress else body
    if compress and len(packed) * 8 <= len(body) * 7:
        body, flags = packed, _ZLIB
    header = _header_varints([len(p.prompt_delta_ids), len(p.output_ids), len(ids), len(ctx)])
    return _MAGIC + bytes([flags]) + header + body


def decode_payload(raw: bytes, *, context: bool = True) -> TokenPayload:
    """Decode ``encode_payload``'s bytes; ``context=False`` skips parsing the context (the trainer's case)."""
    if raw[:4] != _MAGIC or len(raw) < 5:
        raise PayloadError("not a token payload (bad magic or version)")
    flags = raw[4]
    if flags & ~_ZLIB:
        raise PayloadError(f"unknown payload flags {flags:#x}")
    pos = 5
    n_prompt, pos = _read_varint(raw, pos)
    n_output, pos = _read_varint(raw, pos)
    n_ids, pos = _read_varint(raw, pos)
    n_ctx, pos = _read_varint(raw, pos)
    body = raw[pos:]
    if flags & _ZLIB:
        try:
            body = zlib.decompress(body)
        except zlib.error as exc:
            raise PayloadError(f"corrupt compressed payload: {exc}") from exc
    if len(body) != n_ids + 4 * n_output + n_ctx:
        raise PayloadError(f"payload body is {len(body)} bytes, its header says {n_ids + 4 * n_output + n_ctx}")
    ids = _decode_varints(body[:n_ids], n_prompt + n_output).tolist()
    lps = np.frombuffer(body, dtype="<f4", count=n_output, offset=n_ids).astype(np.float64).tolist()
    ctx: dict[str, Any] | None = None
    if context and n_ctx:
        try:
            ctx = _json_dec.decode(body[n_ids + 4 * n_output :])
        except msgspec.DecodeError as exc:
            raise PayloadError(f"corrupt payload context: {exc}") from exc
    return TokenPayload(ids[:n_prompt], ids[n_prompt:], lps, ctx)
