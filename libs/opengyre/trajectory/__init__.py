"""Trajectory trees: the shared-prefix structure of one execution's model calls (proxy writes, trainer reads),
one codec and validator for recorded calls and one row -> node mapping for the stores that fold them,
the compact token payload each call stores once, out of its event, and each execution's size in the proxy's
store (``execution_sizes``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._calls import (
        ENGINE_ID_LEN,
        FINISH_REASON_LEN,
        CallRejected,
        call_row,
        check_call,
        check_payload,
        is_logprob,
        node_from_row,
        pack_ids,
        pack_logprobs,
        pack_spans,
        unpack_ids,
        unpack_logprobs,
        unpack_spans,
    )
    from ._payload import PayloadError, PayloadUnavailable, TokenPayload, decode_payload, encode_payload, payload_digest
    from ._sizes import CALLS_TABLE, EXECUTIONS_TABLE, ExecutionSize, execution_sizes
    from ._stored import join_payload, resolve_calls, split_payload
    from ._tree import Node, PathSequence, TrajectoryError, TrajectoryTree

_WHERE: dict[str, str] = {
    "ENGINE_ID_LEN": "_calls",
    "FINISH_REASON_LEN": "_calls",
    "CallRejected": "_calls",
    "call_row": "_calls",
    "check_call": "_calls",
    "check_payload": "_calls",
    "is_logprob": "_calls",
    "node_from_row": "_calls",
    "pack_ids": "_calls",
    "pack_logprobs": "_calls",
    "pack_spans": "_calls",
    "unpack_ids": "_calls",
    "unpack_logprobs": "_calls",
    "unpack_spans": "_calls",
    "PayloadError": "_payload",
    "PayloadUnavailable": "_payload",
    "TokenPayload": "_payload",
    "decode_payload": "_payload",
    "encode_payload": "_payload",
    "payload_digest": "_payload",
    "CALLS_TABLE": "_sizes",
    "EXECUTIONS_TABLE": "_sizes",
    "ExecutionSize": "_sizes",
    "execution_sizes": "_sizes",
    "join_payload": "_stored",
    "resolve_calls": "_stored",
    "split_payload": "_stored",
    "Node": "_tree",
    "PathSequence": "_tree",
    "TrajectoryError": "_tree",
    "TrajectoryTree": "_tree",
}

__all__ = [
    "CALLS_TABLE",
    "ENGINE_ID_LEN",
    "EXECUTIONS_TABLE",
    "FINISH_REASON_LEN",
    "CallRejected",
    "ExecutionSize",
    "Node",
    "PathSequence",
    "PayloadError",
    "PayloadUnavailable",
    "TokenPayload",
    "TrajectoryError",
    "TrajectoryTree",
    "call_row",
    "check_call",
    "check_payload",
    "decode_payload",
    "encode_payload",
    "execution_sizes",
    "is_logprob",
    "join_payload",
    "node_from_row",
    "pack_ids",
    "pack_logprobs",
    "pack_spans",
    "payload_digest",
    "resolve_calls",
    "split_payload",
    "unpack_ids",
    "unpack_logprobs",
    "unpack_spans",
]


# Names load on first use (PEP 562): a trainer's cell process needs is_logprob alone; eager, it also paid for
# the store's sqlalchemy and the event log's nats-py (~0.6 CPU-s; bench/import_cost.py).
__getattr__ = lazy_exports(__name__, _WHERE)
