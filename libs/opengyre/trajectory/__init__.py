"""Trajectory trees: the shared-prefix structure of one execution's model calls (proxy writes, trainer reads),
and the compact token payload each call stores once, out of its event."""

from ._payload import PayloadError, PayloadUnavailable, TokenPayload, decode_payload, encode_payload, payload_digest
from ._stored import join_payload, resolve_calls, split_payload
from ._tree import Node, PathSequence, TrajectoryError, TrajectoryTree

__all__ = [
    "Node",
    "PathSequence",
    "PayloadError",
    "PayloadUnavailable",
    "TokenPayload",
    "TrajectoryError",
    "TrajectoryTree",
    "decode_payload",
    "encode_payload",
    "join_payload",
    "payload_digest",
    "resolve_calls",
    "split_payload",
]
