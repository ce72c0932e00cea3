"""Trajectory trees: the shared-prefix structure of one execution's model calls (proxy writes, trainer reads),
one codec and validator for recorded calls and one row -> node mapping for the stores that fold them,
the compact token payload each call stores once, out of its event, and each execution's size in the proxy's
store (``execution_sizes``)."""

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
