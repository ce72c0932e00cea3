"""The CPU engine's HTTP face: SGLang's native API, OpenAI routes, and a request log for verification."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import _anthropic as anthropic_api
from .. import _openai as openai_api
from .._assembly import Outcome, assemble
from .._errors import ApiError
from .._request import GenRequest
from ._engine import CpuEngine, Generation
from ._sampling import SamplingError, SamplingParams

__all__ = ["build_app"]

_enc = msgspec.json.Encoder()
_OPEN_PATHS = {"/health", "/health_generate", "/ready", "/metrics"}


class _Json(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _enc.encode(content)


def _native_error(message: str, status: int = 400) -> Response:
    return _Json({"error": {"message": message}}, status_code=status)


def _gate_error(message: str) -> Response:
    # SGLang's request contract gate answers with a flat string.
    return _Json({"error": message}, status_code=400)


class _BadBody(ValueError):
    """A body that is not JSON: every route answers 400 (the app's handler), never 500."""


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return msgspec.json.decode(raw) if raw else {}
    except msgspec.DecodeError as exc:
        raise _BadBody(f"malformed JSON body: {exc}") from None


async def _bad_body(request: Request, exc: Exception) -> Response:
    return _native_error(str(exc))


def _trimmed_text(engine: CpuEngine, gen: Generation, params: SamplingParams, start: int = 0) -> str:
    text = engine.codec.decode(gen.output_ids[start:], skip_special=params.skip_special_tokens)
    matched = (gen.finish or {}).get("matched")
    if isinstance(matched, str) and not params.no_stop_trim and matched in text:
        text = text[: text.index(matched)]
    return text


def _result(
    engine: CpuEngine,
    gen: Generation,
    params: SamplingParams,
    *,
    return_logprob: bool,
    logprob_start_len: int,
    return_prompt_ids: list[int] | None,
    start: int = 0,
) -> dict[str, Any]:
    ids = gen.output_ids[start:]
    meta: dict[str, Any] = {
        "id": gen.rid,
        "finish_reason": gen.finish,
        "prompt_tokens": gen.prompt_len,
        "completion_tokens": len(gen.output_ids),
        "cached_tokens": gen.cached_tokens,
        "weight_version": gen.weight_version,
        "weight_versions": [{"version": v, "start": a, "end": b} for v, a, b in gen.weight_spans],
        "e2e_latency": time.perf_counter() - gen.created,
    }
    if return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tid, None] for lp, tid in zip(gen.output_logprobs[start:], ids, strict=False)
        ]
        if gen.output_top:
            meta["output_top_logprobs"] = gen.output_top[start:]
        if logprob_start_len >= 0:
            meta["input_token_logprobs"] = [
                [lp, tid, None]
                for lp, tid in zip(
                    gen.input_logprobs[logprob_start_len:], (return_prompt_ids or [])[logprob_start_len:], strict=False
                )
            ]
    out: dict[str, Any] = {"text": _trimmed_text(engine, gen, params, start), "output_ids": ids, "meta_info": meta}
    return out


class _Parsed(msgspec.Struct):
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_prompt_token_ids: bool


def _parse_one(engine: CpuEngine, body: dict[str, Any], i: int | None) -> _Parsed | Response:
    def pick(key: str) -> Any:
        v = body.get(key)
        if i is not None and isinstance(v, list) and key != "input_ids" and key != "stop":
            return v[i] if i < len(v) else None
        return v

    if body.get("input_embeds") is not None:
        return _native_error("input_embeds is not supported by the OpenGyre CPU engine")
    ids = body.get("input_ids")
    text = body.get("text")
    if ids is not None:
        ids = ids[i] if i is not None else ids
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return _native_error("input_ids must be a list of token ids")
    elif text is not None:
        t = text[i] if i is not None else text
        if not isinstance(t, str):
            return _native_error("text must be a string")
        ids = engine.codec.encode(t)
    else:
        return _native_error("Either text, input_ids or input_embeds should be provided.")
    if not ids:
        return _native_error("the prompt is empty")
    if any(t < 0 or t >= engine.vocab_size for t in ids):
        return _native_error(f"input_ids must be in [0, {engine.vocab_size})")
    if len(ids) >= engine.context_length:
        return _native_error(
            f"The input ({len(ids)} tokens) is longer than the model's context length ({engine.context_length} tokens)."
        )
    try:
        params = SamplingParams.parse(pick("sampling_params"), engine.vocab_size)
    except SamplingError as exc:
        return _gate_error(str(exc))
    rid = pick("rid")
    if rid is not None and not isinstance(rid, str):
        return _native_error("rid must be a string")
    lsl = pick("logprob_start_len")
    tln = pick("top_logprobs_num")
    return _Parsed(
        rid=rid or uuid.uuid4().hex,
        input_ids=ids,
        params=params,
        return_logprob=bool(pick("return_logprob")),
        logprob_start_len=int(lsl) if isinstance(lsl, int) else -1,
        top_logprobs_num=int(tln) if isinstance(tln, int) else 0,
        return_prompt_token_ids=bool(pick("return_prompt_token_ids")),
    )


def _refused_status(finish: dict[str, Any]) -> int | None:
    """The HTTP status of a request the engine refused (an abort with a 4xx/5xx code), else None."""
    code = finish.get("status_code")
    if finish.get("type") == "abort" and isinstance(code, int) and code >= 400:
        return code
    return None


def build_app(engine: CpuEngine) -> ASGIApp:
    cfg = engine.config

    def generations(p: _Parsed) -> contextlib.aclosing[AsyncGenerator[Generation, None]]:
        return contextlib.aclosing(
            engine.generate(
                p.input_ids,
                p.params,
                rid=p.rid,
                return_logprob=p.return_logprob,
                logprob_start_len=p.logprob_start_len,
                top_logprobs_num=p.top_logprobs_num,
            )
        )

    def result(p: _Parsed, gen: Generation, start: int = 0) -> dict[str, Any]:
        out = _result(
            engine,
            gen,
            p.params,
            return_logprob=p.return_logprob,
            logprob_start_len=p.logprob_start_len,
            return_prompt_ids=p.input_ids,
            start=start,
        )
        if p.return_prompt_token_ids:
            out["prompt_token_ids"] = p.input_ids
        return out

    async def run_once(p: _Parsed) -> tuple[Generation, dict[str, Any]]:
        gen: Generation | None = None
        async with generations(p) as it:
            async for g in it:
                gen = g
        assert gen is not None
        return gen, result(p, gen)

    async def generate(request: Request) -> Response:
        body = await _json_body(request)
        if not isinstance(body, dict):
            return _native_error("the request body must be a JSON object")
        ids = body.get("input_ids")
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        batch = batch or isinstance(body.get("text"), list)
        if batch:
            if body.get("stream"):
                return _native_error("streaming a batch is not supported by the OpenGyre CPU engine")
            n = len(ids) if isinstance(ids, list) else len(body["text"])
            parsed = [_parse_one(engine, body, i) for i in range(n)]
            for p in parsed:
                if isinstance(p, Response):
                    return p
            results = await asyncio.gather(*(run_once(p) for p in parsed if isinstance(p, _Parsed)))
            return _Json([r[1] for r in results])
        p1 = _parse_one(engine, body, None)
        if isinstance(p1, Response):
            return p1
        if not body.get("stream"):
            gen, out = await run_once(p1)
            fin = gen.finish or {}
            if (status := _refused_status(fin)) is not None:
                return _native_error(str(fin.get("message", "aborted")), status)
            return _Json(out)
        return StreamingResponse(stream(p1), media_type="text/event-stream")

    async def stream(p: _Parsed) -> AsyncIterator[bytes]:
        sent = 0
        async with generations(p) as it:
            async for g in it:
                fin = g.finish or {}
                if (status := _refused_status(fin)) is not None:
                    err = {
                        "message": fin.get("message", ""),
                        "type": "invalid_request_error",
                        "code": status,
                        "retryable": False,
                    }
                    yield b"data: " + _enc.encode({"error": err}) + b"\n\n"
                    break
                out = result(p, g, start=sent if cfg.incremental_streaming_output else 0)
                if cfg.incremental_streaming_output:
                    sent = len(g.output_ids)
                yield b"data: " + _enc.encode(out) + b"\n\n"
        yield b"data: [DONE]\n\n"

    async def abort_request(request: Request) -> Response:
        body = await _json_body(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        engine.abort(str(rid or ""), bool(body.get("abort_all")) if isinstance(body, dict) else False)
        return Response(status_code=200)

    async def update_weights_from_disk(request: Request) -> Response:
        body = await _json_body(request)
        path = body.get("model_path") if isinstance(body, dict) else None
        if not isinstance(path, str) or not path:
            return _Json({"success": False, "message": "model_path is required", "num_paused_requests": 0}, 400)
        version = body.get("weight_version")
        try:
            new = await engine.update_weights_from_disk(
                path, str(version) if version else None, abort_all_requests=bool(body.get("abort_all_requests"))
            )
        except Exception as exc:
            return _Json(
                {"success": False, "message": f"Failed to update weights: {exc}", "num_paused_requests": 0}, 400
            )
        return _Json(
            {
                "success": True,
                "message": f"Succeeded to update model weights (weight_version={new}).",
                "num_paused_requests": 0,
                "weight_version": new,
            }
        )

    async def update_weight_version(request: Request) -> Response:
        body = await _json_body(request)
        v = body.get("new_version") if isinstance(body, dict) else None
        if not isinstance(v, str) or not v:
            return _Json({"success": False, "message": "new_version is required"}, 400)
        if body.get("abort_all_requests", True):
            engine.abort("", abort_all=True)
        await engine.set_weight_version(v)
        return _Json({"success": True, "message": "Weight version updated", "new_version": v})

    async def pause_generation(request: Request) -> Response:
        body = await _json_body(request)
        mode = body.get("mode", "abort") if isinstance(body, dict) else None
        if mode not in ("abort", "retract", "in_place"):
            return _native_error("mode must be abort, retract or in_place")
        if mode == "abort":
            engine.abort("", abort_all=True)
        # retract and in_place both keep the requests (and, here, their KV) until continue_generation.
        engine.scheduler.set_paused(True)
        return _Json({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(request: Request) -> Response:
        engine.scheduler.set_paused(False)
        return _Json({"message": "Generation continued successfully.", "status": "ok"})

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
        return _Json(model_info_body())

    async def server_info(request: Request) -> Response:
        return _Json(
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
                    _Parsed(
                        uuid.uuid4().hex, [0], SamplingParams(max_new_tokens=1, temperature=0.0), False, -1, 0, False
                    )
                )
        except TimeoutError:
            return Response(status_code=503)
        return Response(status_code=200)

    async def request_log(request: Request) -> Response:
        rid = request.query_params.get("rid")
        return _Json([_record(r) for r in engine.request_log(rid)])

    # --- OpenAI routes (no TITO here: the proxy is what records) ----------------------------------------

    def _openai_error(err: ApiError) -> Response:
        return _Json(openai_api.error_body(err), status_code=err.status)

    async def models(request: Request) -> Response:
        return _Json(openai_api.models_body([cfg.model_name]))

    def _prepare(req: GenRequest) -> tuple[list[int], dict[str, Any]]:
        if req.model != cfg.model_name:
            raise ApiError(404, "not_found", f"The model `{req.model}` does not exist.", code="model_not_found")
        if req.messages is not None:
            ids = engine.codec.render_ids(req.messages, req.tools)
        elif req.prompt_ids is not None:
            ids = req.prompt_ids
        else:
            ids = engine.codec.encode(req.prompt_text or "")
        room = engine.context_length - len(ids)
        if room <= 0:
            raise ApiError.invalid(
                f"This model's maximum context length is {engine.context_length} tokens. However, your messages "
                f"resulted in {len(ids)} tokens.",
                code="context_length_exceeded",
                param="messages",
            )
        sp = dict(req.sampling)
        sp["max_new_tokens"] = min(req.max_tokens or room, room)
        if req.stop:
            sp["stop"] = req.stop
        return ids, sp

    async def _openai(request: Request, chat: bool) -> Response:
        try:
            body = await _json_body(request)
        except ValueError as exc:
            return _openai_error(ApiError.invalid(str(exc)))
        try:
            req = openai_api.parse_chat(body) if chat else openai_api.parse_completion(body)
            ids, sp = _prepare(req)
            params = SamplingParams.parse(sp, engine.vocab_size)
        except ApiError as err:
            return _openai_error(err)
        except SamplingError as exc:
            return _openai_error(ApiError.invalid(str(exc)))
        rid = str(body.get("request_id") or uuid.uuid4().hex)  # vLLM's extra field names the request
        outcome = Outcome(prompt_tokens=len(ids))

        async def source() -> AsyncIterator[tuple[list[int], list[float]]]:
            seen = 0
            async with contextlib.aclosing(engine.generate(ids, params, rid=rid, return_logprob=True)) as it:
                async for g in it:
                    new_ids, new_lps = g.output_ids[seen:], g.output_logprobs[seen:]
                    seen = len(g.output_ids)
                    outcome.output_ids, outcome.output_logprobs = list(g.output_ids), list(g.output_logprobs)
                    outcome.finish, outcome.weight_version = g.finish, g.weight_version
                    outcome.cached_tokens = g.cached_tokens
                    yield new_ids, new_lps

        if req.stream:
            fmt = openai_api.chat_stream if chat else openai_api.completion_stream
            return StreamingResponse(
                fmt(req, engine.codec, source(), lambda: outcome, ids, rid), media_type="text/event-stream"
            )
        async for _ in source():
            pass
        if chat:
            turn = assemble(engine.codec, outcome)
            return _Json(openai_api.chat_response(req, engine.codec, outcome, turn, ids, rid))
        turn = assemble(engine.codec, outcome, parse_tools=False)
        return _Json(openai_api.completion_response(req, engine.codec, outcome, turn.content, ids, rid))

    async def chat_completions(request: Request) -> Response:
        return await _openai(request, True)

    async def completions(request: Request) -> Response:
        return await _openai(request, False)

    async def count_tokens(request: Request) -> Response:
        try:
            req = anthropic_api.count_tokens_request(await _json_body(request))
        except (ApiError, ValueError) as err:
            e = err if isinstance(err, ApiError) else ApiError.invalid(str(err))
            return _Json(anthropic_api.error_body(e), status_code=e.status)
        return _Json({"input_tokens": len(engine.codec.render_ids(req.messages or [], req.tools))})

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST", "PUT"]),
            Route("/abort_request", abort_request, methods=["POST"]),
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
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
        ],
        exception_handlers={_BadBody: _bad_body},
    )
    if cfg.api_key:
        return _BearerAuth(app, cfg.api_key)  # type: ignore[return-value]
    return app


def _record(r: Any) -> dict[str, Any]:
    return {k: getattr(r, k) for k in r.__dataclass_fields__}


class _BearerAuth:
    """SGLang's ``--api-key``: every route but health needs ``Authorization: Bearer <key>``."""

    def __init__(self, app: ASGIApp, key: str) -> None:
        self.app = app
        self.key = key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in _OPEN_PATHS:
            header = dict(scope.get("headers") or []).get(b"authorization", b"").decode()
            if not header.startswith("Bearer "):
                await _Json({"error": "Unauthorized"}, status_code=401)(scope, receive, send)
                return
            if header[len("Bearer ") :] != self.key:
                await _Json({"error": "Forbidden"}, status_code=403)(scope, receive, send)
                return
        await self.app(scope, receive, send)
