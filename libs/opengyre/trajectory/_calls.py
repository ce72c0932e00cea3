"""One codec and one validator for recorded model calls, shared by every store that folds them (the proxy's
trajectory store, the trainer's), and the one mapping from such a row to a tree node.

Rows keep inline tokens packed little-endian: ids int32, logprobs float32 (what the engines produce and the
trainer computes in, as in the payload format), weight-version spans as compact JSON. A call whose tokens are
in the payload store keeps its digest and lengths; its ids and logprobs are checked by the same rules when
they are read (``node_from_row``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..events import ModelCallRecorded
from ._payload import PayloadError, PayloadUnavailable, TokenPayload, decode_payload
from ._tree import Node, TrajectoryError

if (
    TYPE_CHECKING
):  # an annotation only: the event log's module imports nats-py (~0.3 CPU-s), a trainer's cell needs none
    from ..eventlog import PayloadFetch

__all__ = [
    "ENGINE_ID_LEN",
    "FINISH_REASON_LEN",
    "CallRejected",
    "call_row",
    "check_call",
    "check_payload",
    "is_logprob",
    "node_from_row",
    "pack_ids",
    "pack_logprobs",
    "pack_spans",
    "unpack_ids",
    "unpack_logprobs",
    "unpack_spans",
]


def pack_ids(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def unpack_ids(raw: bytes) -> list[int]:
    return np.frombuffer(raw, dtype="<i4").astype(np.int64).tolist()  # type: ignore[no-any-return]


def pack_logprobs(xs: Sequence[float]) -> bytes:
    return np.asarray(xs, dtype="<f4").tobytes()


def unpack_logprobs(raw: bytes) -> list[float]:
    return np.frombuffer(raw, dtype="<f4").astype(np.float64).tolist()  # type: ignore[no-any-return]


def pack_spans(spans: Sequence[tuple[str, int, int]]) -> str:
    return json.dumps([list(x) for x in spans], separators=(",", ":"))


def unpack_spans(raw: str) -> tuple[tuple[str, int, int], ...]:
    """Spans from ``pack_spans`` (an empty text: none, as rows written before it kept them)."""
    return tuple((str(v), int(a), int(b)) for v, a, b in json.loads(raw)) if raw else ()


def is_logprob(x: float) -> bool:
    """A log probability, allowing float noise above 0."""
    return math.isfinite(x) and x <= 1e-6


class CallRejected(TrajectoryError):
    """A recorded call that cannot be a node of its execution's tree; ``reason`` is short and stable."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


# The widths of the free-text columns every call store keeps: a longer value (an engine's own finish reason, the
# ","-joined engines of a rerouted call) is cut to fit, the same way in every store, so the row fits on any
# backend (Postgres enforces the width; SQLite does not) and a rebuild gives the same bytes.
FINISH_REASON_LEN = 32
ENGINE_ID_LEN = 255


def call_row(e: ModelCallRecorded, seq: int) -> dict[str, Any]:
    """The columns every store of recorded calls keeps, from the event (after ``check_call`` accepted it): the
    tree's shape, the inline tokens packed by this codec (empty when they are in the payload store), the payload
    reference, and what the call ran on. A store adds its own columns to it."""
    ref = e.payload
    return {
        "execution_id": e.execution_id,
        "call_id": e.call_id,
        "seq": seq,
        "parent_call_id": e.parent_call_id,
        "prefix_len": e.prefix_len,
        "n_tokens": e.prefix_len + e.n_prompt_delta + e.n_output,
        "n_prompt_delta": e.n_prompt_delta,
        "n_output": e.n_output,
        "prompt_delta": pack_ids(e.prompt_delta_ids),
        "output_ids": pack_ids(e.output_ids),
        "output_logprobs": pack_logprobs(e.output_logprobs),
        "payload_digest": ref.digest if ref else None,
        "payload_size": ref.size if ref else None,
        "compacted_seq": None,
        "role": e.role,
        "weight_version": e.weight_version,
        "weight_spans": pack_spans([(w.version, w.start, w.end) for w in e.weight_versions]),
        "temperature": e.temperature,
        "finish_reason": e.finish_reason[:FINISH_REASON_LEN],
        "engine_id": e.engine_id[:ENGINE_ID_LEN],
    }


def check_call(e: ModelCallRecorded, *, known: dict[str, int]) -> None:
    """Refuse (``CallRejected``) a call that cannot join its execution's tree, given ``known``: the calls
    already accepted for the execution, call id -> its token count. The rules every store folds by."""
    who = f"call {e.call_id} of {e.execution_id}"
    ref = e.payload
    if ref is not None and (e.prompt_delta_ids or e.output_ids or e.output_logprobs or e.context is not None):
        raise CallRejected("ambiguous-tokens", f"{who}: tokens or context both inline and in a payload")
    if ref is not None and min(ref.prompt_delta, ref.output, ref.size) < 0:
        raise CallRejected("bad-payload-ref", f"{who}: negative payload lengths")
    if len(e.output_ids) != len(e.output_logprobs):
        raise CallRejected(
            "length-mismatch", f"{who}: {len(e.output_ids)} output ids but {len(e.output_logprobs)} logprobs"
        )
    if any(t < 0 for t in e.prompt_delta_ids) or any(t < 0 for t in e.output_ids):
        raise CallRejected("corrupt-tokens", f"{who}: negative token id")
    if not all(is_logprob(x) for x in e.output_logprobs):
        raise CallRejected("corrupt-logprobs", f"{who}: a logprob is not in (-inf, 0]")
    if e.prefix_len < 0:
        raise CallRejected("bad-prefix", f"{who}: negative prefix_len")
    n_out = e.n_output
    if any(not (0 <= w.start < w.end <= n_out) for w in e.weight_versions):
        raise CallRejected("bad-weight-spans", f"{who}: a version span outside its {n_out} outputs")
    if e.call_id in known:
        raise CallRejected("duplicate-call", f"{who} is already recorded")
    if e.parent_call_id is None:
        if e.prefix_len != 0:
            raise CallRejected("bad-prefix", f"root {who} has prefix_len {e.prefix_len}")
    elif e.parent_call_id not in known:
        raise CallRejected("unknown-parent", f"{who}: unknown parent {e.parent_call_id}")
    elif e.prefix_len > known[e.parent_call_id]:
        raise CallRejected(
            "bad-prefix", f"{who}: prefix_len {e.prefix_len} past the parent's {known[e.parent_call_id]} tokens"
        )


def check_payload(who: str, raw: bytes, n_prompt_delta: int, n_output: int, *, context: bool = True) -> TokenPayload:
    """A call's payload decoded and checked by the rules ``check_call`` applies to inline tokens (and the
    lengths its event recorded); ``PayloadError`` otherwise."""
    p = decode_payload(raw, context=context)
    if (len(p.prompt_delta_ids), len(p.output_ids)) != (n_prompt_delta, n_output):
        raise PayloadError(
            f"the payload of {who} has {len(p.prompt_delta_ids)}+{len(p.output_ids)} tokens, "
            f"the event says {n_prompt_delta}+{n_output}"
        )
    if not all(is_logprob(x) for x in p.output_logprobs):
        raise PayloadError(f"the payload of {who}: a logprob is not in (-inf, 0]")
    return p


def node_from_row(r: Any, payloads: PayloadFetch | None, *, spans: str) -> Node:
    """The tree node of a stored call row (columns: ``execution_id``, ``call_id``, ``parent_call_id``,
    ``prefix_len``, ``n_prompt_delta``, ``n_output``, ``prompt_delta``, ``output_ids``, ``output_logprobs``,
    ``payload_digest``, ``compacted_seq``, ``role``, ``weight_version``, ``temperature``, ``finish_reason``;
    ``spans`` the packed weight-version spans), its tokens from the row or from ``payloads``.

    Raises ``PayloadUnavailable`` (``payload-compacted``, ``payload-missing``, ``payload-corrupt``) when a
    call's recorded tokens cannot be had: never a guess in their place."""
    if r.payload_digest is None:
        prompt, output, logprobs = (
            unpack_ids(r.prompt_delta),
            unpack_ids(r.output_ids),
            unpack_logprobs(r.output_logprobs),
        )
    else:
        who = f"call {r.call_id} of {r.execution_id}"
        if r.compacted_seq is not None:
            raise PayloadUnavailable("payload-compacted", f"the payload of {who} was compacted (retention)")
        key = (r.execution_id, r.payload_digest)
        raw = payloads.found.get(key) if payloads is not None else None
        if raw is None:
            reason = payloads.failed.get(key, "payload-missing") if payloads is not None else "payload-missing"
            raise PayloadUnavailable(reason, f"the payload of {who} is not available ({reason})")
        try:
            p = check_payload(who, raw, r.n_prompt_delta, r.n_output, context=False)
        except PayloadError as exc:
            raise PayloadUnavailable("payload-corrupt", str(exc)) from exc
        prompt, output, logprobs = list(p.prompt_delta_ids), list(p.output_ids), list(p.output_logprobs)
    return Node(
        call_id=r.call_id,
        parent_call_id=r.parent_call_id,
        prefix_len=r.prefix_len,
        prompt_delta_ids=tuple(prompt),
        output_ids=tuple(output),
        output_logprobs=tuple(logprobs),
        role=r.role,
        weight_version=r.weight_version,
        weight_spans=unpack_spans(spans),
        temperature=r.temperature,
        finish_reason=r.finish_reason,
    )
