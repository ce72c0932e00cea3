"""Weight publishing: a safetensors checkpoint per step, a ``WeightsPublished`` event, engines hot-reload.

Engines speak SGLang's ``POST /update_weights_from_disk`` (``{"model_path", "weight_version"}`` ->
``{"success", "message", ...}``); the built-in CPU engine serves the same route and verifies the checkpoint's
digest before loading anything. The checkpoint is written atomically by ``opengyre.models.save_checkpoint`` so
an engine never loads a half-written file. A reload that did not get through (the network, a 5xx) is retried
with backoff; one the engine refused (a 4xx: a corrupt or unfitting checkpoint) is not: the same file would be
refused again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tenacity import AsyncRetrying, retry_if_result, stop_after_attempt, wait_exponential

from opengyre.models import build_model, load_state, save_checkpoint

from .backends import Backend

__all__ = [
    "EngineReload",
    "PublishedCheckpoint",
    "checkpoint_path",
    "engine_versions",
    "export_checkpoint",
    "reload_engines",
    "weight_version",
    "write_checkpoint",
]


@dataclass(frozen=True)
class PublishedCheckpoint:
    weight_version: str
    step: int
    path: Path
    digest: str


@dataclass(frozen=True)
class EngineReload:
    url: str
    success: bool
    message: str
    refused: bool = False  # the engine answered and refused the checkpoint (retrying cannot help)
    attempts: int = 1


def weight_version(run_id: str, step: int) -> str:
    return f"{run_id}-s{step}"


def export_checkpoint(backend: Backend, path: Path, version: str) -> str:
    """Write the backend's weights (whatever its layout) as a Hugging Face Llama checkpoint; returns the digest."""
    model = build_model(backend.config)
    load_state(model, backend.hf_state_dict())
    return save_checkpoint(model, Path(path), version)


def checkpoint_path(root: Path, run_id: str, step: int) -> Path:
    return Path(root) / run_id / f"step-{step:06d}"


def write_checkpoint(backend: Backend, root: Path, run_id: str, step: int) -> PublishedCheckpoint:
    """The checkpoint of one step, at ``<root>/<run_id>/step-<step>``."""
    version = weight_version(run_id, step)
    path = checkpoint_path(root, run_id, step)
    digest = export_checkpoint(backend, path, version)
    return PublishedCheckpoint(version, step, path.resolve(), digest)


async def engine_versions(urls: Sequence[str], *, timeout_s: float = 10.0) -> dict[str, str | None]:
    """The weight version each engine serves (SGLang ``GET /model_info``); None where it did not answer."""

    async def one(client: httpx.AsyncClient, url: str) -> tuple[str, str | None]:
        try:
            r = await client.get(url.rstrip("/") + "/model_info")
            v = _json_object(r).get("weight_version") if r.status_code == 200 else None
            return url, (str(v) if v is not None else None)
        except (httpx.HTTPError, ValueError):
            return url, None

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return dict(await asyncio.gather(*(one(client, u) for u in urls)))


async def reload_engines(
    urls: Sequence[str],
    ckpt: PublishedCheckpoint,
    *,
    timeout_s: float = 120.0,
    attempts: int = 1,
    backoff_s: float = 0.2,
) -> list[EngineReload]:
    """Ask every engine to load the checkpoint; failures are reported, not raised (an engine may be gone). A
    failure to get through is tried again up to ``attempts`` times (exponential backoff from ``backoff_s``)."""

    async def once(client: httpx.AsyncClient, url: str) -> EngineReload:
        body = {"model_path": str(ckpt.path), "weight_version": ckpt.weight_version, "abort_all_requests": False}
        try:
            r = await client.post(url.rstrip("/") + "/update_weights_from_disk", json=body)
            data = _json_object(r) if r.headers.get("content-type", "").startswith("application/json") else {}
            ok = r.status_code == 200 and bool(data.get("success", False))
            return EngineReload(url, ok, str(data.get("message", r.text[:200])), refused=400 <= r.status_code < 500)
        except (httpx.HTTPError, ValueError) as exc:
            return EngineReload(url, False, f"{type(exc).__name__}: {exc}")

    async def one(client: httpx.AsyncClient, url: str) -> EngineReload:
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_exponential(multiplier=backoff_s, max=10 * backoff_s),
            retry=retry_if_result(lambda r: not r.success and not r.refused),
            retry_error_callback=lambda state: state.outcome.result() if state.outcome is not None else None,
        )
        out: EngineReload = await retrying(once, client, url)
        return dataclasses.replace(out, attempts=retrying.statistics.get("attempt_number", 1))

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return list(await asyncio.gather(*(one(client, u) for u in urls)))


def _json_object(r: httpx.Response) -> dict[str, Any]:
    """The body as a JSON object; anything else an engine sends (a list, a string) reads as an empty one."""
    data = r.json()
    return data if isinstance(data, dict) else {}
