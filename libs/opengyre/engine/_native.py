"""SGLang's native generation API on the CPU engine: ``/generate`` (single, batch, streamed) and ``/abort_request``."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.asgi import Json
from opengyre.wire import DONE, Frame

from ._common import gate_error, json_body, native_error
from ._engine import CpuEngine, Generation
from ._sampling import SamplingError, SamplingParams

__all__ = ["Parsed", "native_routes", "run_once"]


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


class Parsed(msgspec.Struct):
    rid: str
    input_ids: list[int]
    params: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_prompt_token_ids: bool


def _parse_one(engine: CpuEngine, body: dict[str, Any], i: int | None) -> Parsed | Response:
    def pick(key: str) -> Any:
        v = body.get(key)
        if i is not None and isinstance(v, list) and key != "input_ids" and key != "stop":
            return v[i] if i < len(v) else None
        return v

    if body.get("input_embeds") is not None:
        return native_error("input_embeds is not supported by the OpenGyre CPU engine")
    ids = body.get("input_ids")
    text = body.get("text")
    if ids is not None:
        ids = ids[i] if i is not None else ids
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            return native_error("input_ids must be a list of token ids")
    elif text is not None:
        t = text[i] if i is not None else text
        if not isinstance(t, str):
            return native_error("text must be a string")
        ids = engine.codec.encode(t)
    else:
        return native_error("Either text, input_ids or input_embeds should be provided.")
    if not ids:
        return native_error("the prompt is empty")
    if any(t < 0 or t >= engine.vocab_size for t in ids):
        return native_error(f"input_ids must be in [0, {engine.vocab_size})")
    if len(ids) >= engine.context_length:
        return native_error(
            f"The input ({len(ids)} tokens) is longer than the model's context length ({engine.context_length} tokens)."
        )
    try:
        params = SamplingParams.parse(pick("sampling_params"), engine.vocab_size)
    except SamplingError as exc:
        return gate_error(str(exc))
    rid = pick("rid")
    if rid is not None and not isinstance(rid, str):
        return native_error("rid must be a string")
    lsl = pick("logprob_start_len")
    tln = pick("top_logprobs_num")
    return Parsed(
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


def _generations(engine: CpuEngine, p: Parsed) -> contextlib.aclosing[AsyncGenerator[Generation, None]]:
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


def _result_of(engine: CpuEngine, p: Parsed, gen: Generation, start: int = 0) -> dict[str, Any]:
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


async def run_once(engine: CpuEngine, p: Parsed) -> tuple[Generation, dict[str, Any]]:
    gen: Generation | None = None
    async with _generations(engine, p) as it:
        async for g in it:
            gen = g
    assert gen is not None
    return gen, _result_of(engine, p, gen)


def native_routes(engine: CpuEngine) -> list[Route]:
    """``/generate`` and ``/abort_request`` as SGLang serves them."""

    async def generate(request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, dict):
            return native_error("the request body must be a JSON object")
        ids = body.get("input_ids")
        batch = isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)
        batch = batch or isinstance(body.get("text"), list)
        if batch:
            if body.get("stream"):
                return native_error("streaming a batch is not supported by the OpenGyre CPU engine")
            n = len(ids) if isinstance(ids, list) else len(body["text"])
            parsed = [_parse_one(engine, body, i) for i in range(n)]
            for p in parsed:
                if isinstance(p, Response):
                    return p
            results = await asyncio.gather(*(run_once(engine, p) for p in parsed if isinstance(p, Parsed)))
            return Json([r[1] for r in results])
        p1 = _parse_one(engine, body, None)
        if isinstance(p1, Response):
            return p1
        if not body.get("stream"):
            gen, out = await run_once(engine, p1)
            fin = gen.finish or {}
            if (status := _refused_status(fin)) is not None:
                return native_error(str(fin.get("message", "aborted")), status)
            return Json(out)
        return StreamingResponse(stream(p1), media_type="text/event-stream")

    async def stream(p: Parsed) -> AsyncIterator[bytes]:
        sent = 0
        incremental = engine.config.incremental_streaming_output
        shown = ""  # incremental: the text streamed so far
        async with _generations(engine, p) as it:
            async for g in it:
                fin = g.finish or {}
                if (status := _refused_status(fin)) is not None:
                    err = {
                        "message": fin.get("message", ""),
                        "type": "invalid_request_error",
                        "code": status,
                        "retryable": False,
                    }
                    yield Frame({"error": err}).encode()
                    break
                out = _result_of(engine, p, g, start=sent if incremental else 0)
                if incremental:
                    # A delta's ids alone may end inside a character: its text waits for the rest (as SGLang's
                    # incremental detokenizer holds it) and the last chunk flushes what is held, an incomplete
                    # character as U+FFFD, so the deltas join to the unstreamed text.
                    whole = _trimmed_text(engine, g, p.params)
                    if g.finish is None:
                        whole = whole.rstrip("\ufffd")
                    out["text"] = whole[len(shown) :] if whole.startswith(shown) else ""
                    shown += out["text"]
                    sent = len(g.output_ids)
                yield Frame(out).encode()
        yield DONE.encode()

    async def abort_request(request: Request) -> Response:
        body = await json_body(request)
        rid = body.get("rid") if isinstance(body, dict) else None
        engine.abort(str(rid or ""), bool(body.get("abort_all")) if isinstance(body, dict) else False)
        return Response(status_code=200)

    return [
        Route("/generate", generate, methods=["POST", "PUT"]),
        Route("/abort_request", abort_request, methods=["POST"]),
    ]
