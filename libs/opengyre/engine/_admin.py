"""The CPU engine's admin routes (SGLang's names): weights, pause/continue, cache, info, health, request log; and
ours under ``/og/``: the request log and a sequence's KV export and import (``_kv_transfer``)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from opengyre.asgi import Json

from ._common import json_body, native_error
from ._engine import CpuEngine
from ._kv_transfer import KV_MEDIA_TYPE, KVExport, KVTransferError, export_kv, import_kv
from ._native import Parsed, run_once
from ._sampling import SamplingParams

__all__ = ["admin_routes"]


def admin_routes(engine: CpuEngine) -> list[Route]:
    cfg = engine.config

    async def update_weights_from_disk(request: Request) -> Response:
        body = await json_body(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return Json({"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400)
        version = body.get("weight_version")
        try:
            new = await engine.update_weights_from_disk(
                path, str(version) if version else None, abort_all_requests=bool(body.get("abort_all_requests"))
            )
        except Exception as exc:
            return Json(
                {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0}, 400
            )
        return Json(
            {
                "success": True,
                "message": f"Succeeded to update model weights (weight_version={new}).",
                "num_paused_requests": 0,
                "weight_version": new,
            }
        )

    async def update_weight_version(request: Request) -> Response:
        body = await json_body(request)
        v = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(v, str) or not v:
            return Json({"success": False, "message": "new_version is required"}, 400)
        if body.get("abort_all_requests", True):
            engine.abort("", abort_all=True)
        await engine.set_weight_version(v)
        return Json({"success": True, "message": "Weight version updated", "new_version": v})

    async def pause_generation(request: Request) -> Response:
        body = await json_body(request)
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return native_error("mode must be abort, retract or in_place")
        if mode == "abort":
            engine.abort("", abort_all=True)
        # retract and in_place both keep the requests (and, here, their KV) until continue_generation.
        engine.scheduler.set_paused(True)
        return Json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: Request) -> Response:
        engine.scheduler.set_paused(False)
        return Json({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(request: Request) -> Response:
        await engine.flush_cache()
        return PlainTextResponse("Cache flushed.\nPlease check backend logs for more details.")

    def model_info_body() -> dict[str, Any]:
        return {
            "model_path": engine.model_path,
            "served_model_name": cfg.model_name,
            "tokenizer_path": engine.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": engine.weight_version,
            "load_format": "safetensors",
            "reasoning_parser": None,
            "tool_call_parser": "qwen",
            "disaggregation_mode": "null",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "context_length": engine.context_length,
        }

    async def model_info(request: Request) -> Response:
        return Json(model_info_body())

    async def server_info(request: Request) -> Response:
        return Json(
            {
                "served_model_name": cfg.model_name,
                "context_length": engine.context_length,
                "max_running_requests": cfg.max_running,
                "chunked_prefill_size": cfg.prefill_chunk,
                "incremental_streaming_output": cfg.incremental_streaming_output,
                "weight_version": engine.weight_version,
                "internal_states": [
                    {
                        "load": engine.scheduler.load,
                        "steps": engine.scheduler.steps,
                        "prefix_cache_tokens": engine.scheduler.prefix_cache.tokens,
                        "prefix_cache_hits": engine.scheduler.prefix_cache.hits,
                        "prefix_cache_hit_tokens": engine.scheduler.prefix_cache.hit_tokens,
                        "prefill_tokens": engine.scheduler.prefill_tokens,
                        "kv_exports": engine.scheduler.kv_exports,
                        "kv_imports": engine.scheduler.kv_imports,
                        "kv_imported_tokens": engine.scheduler.kv_imported_tokens,
                    }
                ],
                "version": "opengyre-cpu-0.1.0",
            }
        )

    async def health(request: Request) -> Response:
        return Response(status_code=200)

    async def health_generate(request: Request) -> Response:
        try:
            async with asyncio.timeout(20):
                await run_once(
                    engine,
                    Parsed(
                        uuid.uuid4().hex, [0], SamplingParams(max_new_tokens=1, temperature=0.0), False, -1, 0, False
                    ),
                )
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def request_log(request: Request) -> Response:
        rid = request.query_params.get("rid")
        return Json([_record(r) for r in engine.request_log(rid)])

    async def kv_export(request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict) or set(body) - {"rid", "input_ids"} or len(body) != 1:
            return native_error("give exactly one of rid (a running request) or input_ids (a cached prefix)")
        rid, ids = body.get("rid"), body.get("input_ids")
        if "rid" in body and (not isinstance(rid, str) or not rid):
            return native_error("rid must be a non-empty string")
        if "input_ids" in body and (
            not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids)
        ):
            return native_error("input_ids must be a non-empty list of token ids")
        try:
            kv = await asyncio.wrap_future(engine.scheduler.call(lambda: export_kv(engine, rid=rid, token_ids=ids)))
        except KVTransferError as exc:
            return native_error(str(exc), exc.status)
        blob = await asyncio.to_thread(kv.encode)
        return Response(blob, media_type=KV_MEDIA_TYPE, headers={"x-opengyre-kv-tokens": str(len(kv.token_ids))})

    async def kv_import(request: Request) -> Response:
        if request.headers.get("content-type", "").split(";")[0].strip() != KV_MEDIA_TYPE:
            return native_error(f"the body must be a KV export ({KV_MEDIA_TYPE}, from /og/kv/export)", 415)
        blob = await request.body()
        try:
            kv = await asyncio.to_thread(KVExport.decode, blob)
            n = await asyncio.wrap_future(engine.scheduler.call(lambda: import_kv(engine, kv)))
        except KVTransferError as exc:
            return native_error(str(exc), exc.status)
        return Json({"success": True, "tokens": n, "pending_ids": kv.pending_ids})

    return [
        Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"]),
        Route("/update_weight_version", update_weight_version, methods=["POST"]),
        Route("/pause_generation", pause_generation, methods=["POST"]),
        Route("/continue_generation", continue_generation, methods=["POST"]),
        Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/ready", health, methods=["GET"]),
        Route("/health_generate", health_generate, methods=["GET"]),
        Route("/model_info", model_info, methods=["GET"]),
        Route("/get_model_info", model_info, methods=["GET"]),
        Route("/server_info", server_info, methods=["GET"]),
        Route("/get_server_info", server_info, methods=["GET"]),
        Route("/og/request_log", request_log, methods=["GET"]),
        Route("/og/kv/export", kv_export, methods=["POST"]),
        Route("/og/kv/import", kv_import, methods=["POST"]),
    ]


def _record(r: Any) -> dict[str, Any]:
    return {k: getattr(r, k) for k in r.__dataclass_fields__}
