"""Shared domain: the built-in CPU rollout engine, the policy model behind SGLang's native API and OpenAI routes.

Start one in this process with ``EngineServer`` or as a child process with ``EngineProcess``; see
``docs/proxy.md``; ``engine_command`` is ``opengyre engine`` (the proxy registers it). It speaks the wire
formats of ``opengyre.wire`` and serves through ``opengyre.asgi``: no service is imported. Names load on first
use (torch is heavy; the CLI imports this package on every command).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._cli import engine_command
    from ._engine import CpuEngine, EngineConfig, Generation
    from ._kv_transfer import KV_FORMAT, KV_MEDIA_TYPE, KVExport
    from ._launch import EngineProcess, EngineServer, serve_forever
    from ._migrator import EngineKVMigrator
    from ._runner import Projections
    from ._sampling import SamplingError, SamplingParams
    from ._scheduler import RequestRecord

_WHERE = {
    "engine_command": "_cli",
    "CpuEngine": "_engine",
    "EngineConfig": "_engine",
    "Generation": "_engine",
    "KV_FORMAT": "_kv_transfer",
    "KV_MEDIA_TYPE": "_kv_transfer",
    "KVExport": "_kv_transfer",
    "EngineKVMigrator": "_migrator",
    "EngineProcess": "_launch",
    "EngineServer": "_launch",
    "serve_forever": "_launch",
    "Projections": "_runner",
    "SamplingError": "_sampling",
    "SamplingParams": "_sampling",
    "RequestRecord": "_scheduler",
}

__all__ = [
    "KV_FORMAT",
    "KV_MEDIA_TYPE",
    "CpuEngine",
    "EngineConfig",
    "EngineKVMigrator",
    "EngineProcess",
    "EngineServer",
    "Generation",
    "KVExport",
    "Projections",
    "RequestRecord",
    "SamplingError",
    "SamplingParams",
    "engine_command",
    "serve_forever",
]


__getattr__ = lazy_exports(__name__, _WHERE)
