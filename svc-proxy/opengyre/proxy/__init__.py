"""QwenGyre token-in/token-out model gateway with trajectory trees and the engine pool.

- ``Gateway`` / ``GatewayConfig``: the harness-facing HTTP gateway (OpenAI, Anthropic) with TITO recording.
- ``EnginePool``: rollout engines, drain with transparent re-issue, bounded queue; ``KVMigrator`` hook.
- ``TrajectoryProjection`` and ``load_tree`` / ``load_execution`` / ``load_calls`` / ``resolve_stored`` /
  ``list_executions`` / ``path_mask``: the trajectory store (rows refer to token payloads stored once);
  ``SealedFinishes``: the executions whose sealed finish the store folded (the outbox forgets their seals);
  ``export_execution`` / ``export_path``: ATIF.
- ``ChatCodec``: re-exported from ``opengyre.chat``.

The built-in CPU engine is ``opengyre.engine``, the wire formats ``opengyre.wire``, TITO planning and
``replay_conversation`` ``opengyre.tito``, the HTTP server ``opengyre.asgi``.

Names load on first use: the CLI imports this package on every command and must not pay for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from opengyre.chat import ChatCodec

    from ._keys import ExecutionKeys, KeyClaim
    from .engines._client import EngineClient, EngineConnection, EngineOptions
    from .engines._pool import EngineHandle, EnginePool, KVMigrator, NoCapacity, RePrefill
    from .gateway import Gateway, GatewayConfig
    from .recording._atif import ATIF_VERSION, export_execution, export_path
    from .recording._store import SealedFinishes, TrajectoryProjection
    from .recording._trees import (
        ExecutionSummary,
        StoredCall,
        list_executions,
        load_calls,
        load_execution,
        load_tree,
        path_mask,
        resolve_stored,
    )

_WHERE = {
    "ATIF_VERSION": "recording._atif",
    "export_execution": "recording._atif",
    "export_path": "recording._atif",
    "ChatCodec": "opengyre.chat",
    "EngineClient": "engines._client",
    "EngineConnection": "engines._client",
    "EngineOptions": "engines._client",
    "Gateway": "gateway",
    "GatewayConfig": "gateway",
    "ExecutionKeys": "_keys",
    "KeyClaim": "_keys",
    "EngineHandle": "engines._pool",
    "EnginePool": "engines._pool",
    "KVMigrator": "engines._pool",
    "NoCapacity": "engines._pool",
    "RePrefill": "engines._pool",
    "SealedFinishes": "recording._store",
    "TrajectoryProjection": "recording._store",
    "ExecutionSummary": "recording._trees",
    "StoredCall": "recording._trees",
    "list_executions": "recording._trees",
    "load_calls": "recording._trees",
    "load_execution": "recording._trees",
    "load_tree": "recording._trees",
    "path_mask": "recording._trees",
    "resolve_stored": "recording._trees",
}

__all__ = [
    "ATIF_VERSION",
    "ChatCodec",
    "EngineClient",
    "EngineConnection",
    "EngineHandle",
    "EngineOptions",
    "EnginePool",
    "ExecutionKeys",
    "ExecutionSummary",
    "Gateway",
    "GatewayConfig",
    "KVMigrator",
    "KeyClaim",
    "NoCapacity",
    "RePrefill",
    "SealedFinishes",
    "StoredCall",
    "TrajectoryProjection",
    "export_execution",
    "export_path",
    "list_executions",
    "load_calls",
    "load_execution",
    "load_tree",
    "path_mask",
    "resolve_stored",
]


__getattr__ = lazy_exports(__name__, _WHERE)
