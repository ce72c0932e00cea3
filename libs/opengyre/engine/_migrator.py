"""The proxy's ``KVMigrator`` over the CPU engine's own API: a drained request's KV goes from its old engine to
its new one (``/og/kv/export`` then ``/og/kv/import``) before the request is re-issued there, so the new engine
computes only the tokens the old one had not."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import httpx

from ._kv_transfer import KV_MEDIA_TYPE

__all__ = ["EngineKVMigrator"]

log = logging.getLogger(__name__)


class _Engine(Protocol):
    """What the migrator needs of the pool's engine handle."""

    @property
    def url(self) -> str: ...


class EngineKVMigrator:
    """Plugs into ``EnginePool(migrator=...)``. The old engine aborted the request (a drain) and kept its KV in its
    prefix cache; the longest cached prefix of the re-issued tokens is exported and imported. Returns False (the
    new engine re-prefills) when the old engine holds none of it; any other failure raises, and the pool's
    dispatcher re-prefills too (it logs why)."""

    def __init__(self, *, api_key: str | None = None, timeout_s: float = 60.0) -> None:
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = httpx.AsyncClient(timeout=timeout_s)
        self.calls = 0
        self.migrated = 0
        self.tokens = 0  # positions moved instead of recomputed

    async def close(self) -> None:
        await self._http.aclose()

    async def migrate(self, rid: str, source: _Engine, target: _Engine, tokens: Sequence[int]) -> bool:
        self.calls += 1
        r = await self._http.post(
            source.url.rstrip("/") + "/og/kv/export", json={"input_ids": list(tokens)}, headers=self._headers
        )
        if r.status_code == 404:
            log.info("%s: %s holds no KV of its tokens; the new engine re-prefills", rid, source.url)
            return False
        r.raise_for_status()
        got = await self._http.post(
            target.url.rstrip("/") + "/og/kv/import",
            content=r.content,
            headers={**self._headers, "content-type": KV_MEDIA_TYPE},
        )
        got.raise_for_status()
        self.migrated += 1
        self.tokens += int(got.json()["tokens"])
        return True
