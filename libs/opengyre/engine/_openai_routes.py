"""OpenAI (and Anthropic ``count_tokens``) routes on the CPU engine, as SGLang and vLLM serve them.

No TITO here: the proxy is what records; these answer a harness that talks to an engine directly.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.asgi import Json
from opengyre.wire import ApiError, GenRequest, Outcome, assemble, framed, structured_sampling, top_alternatives
from opengyre.wire import anthropic as anthropic_api
from opengyre.wire import openai as openai_api

from ._common import json_body
from ._engine import CpuEngine
from ._sampling import SamplingError, SamplingParams

__all__ = ["openai_routes"]

# vLLM's own top-level fields the proxy's vLLM client sends (engines/_vllm.py): ``request_id`` names the request
# (read below); ``return_tokens_as_token_ids`` asks for alternatives keyed ``token_id:N``, which this face does not
# do yet (it keys them by text, as OpenAI does): accepted as before, a known gap.
_VLLM_EXTRAS = frozenset({"request_id", "return_tokens_as_token_ids"})


def openai_routes(engine: CpuEngine) -> list[Route]:
    cfg = engine.config

    def _openai_error(err: ApiError) -> Response:
        return Json(openai_api.error_body(err), status_code=err.status)

    async def models(request: Request) -> Response:
        return Json(openai_api.models_body([cfg.model_name]))

    def _prepare(req: GenRequest) -> tuple[list[int], dict[str, Any]]:
        if req.n > 1:  # the gateway samples n as n calls; this route answers one
            raise ApiError.invalid("n > 1 is not supported by the OpenGyre CPU engine's OpenAI routes", param="n")
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
        structured_sampling(sp, req.tools, req.tool_choice, req.json_schema, engine.codec.tool_start)
        return ids, sp

    async def _openai(request: Request, chat: bool) -> Response:
        try:
            body = await json_body(request)
        except ValueError as exc:
            return _openai_error(ApiError.invalid(str(exc)))
        try:
            parse = openai_api.parse_chat if chat else openai_api.parse_completion
            req = parse(body, _VLLM_EXTRAS)
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
            async with contextlib.aclosing(
                engine.generate(
                    ids, params, rid=rid, return_logprob=True, top_logprobs_num=req.top_logprobs if req.logprobs else 0
                )
            ) as it:
                async for g in it:
                    new_ids, new_lps = g.output_ids[seen:], g.output_logprobs[seen:]
                    seen = len(g.output_ids)
                    outcome.output_ids, outcome.output_logprobs = list(g.output_ids), list(g.output_logprobs)
                    outcome.output_top = [top_alternatives(t) for t in g.output_top]
                    outcome.finish, outcome.weight_version = g.finish, g.weight_version
                    outcome.cached_tokens = g.cached_tokens
                    yield new_ids, new_lps

        if req.stream:
            fmt = openai_api.chat_stream if chat else openai_api.completion_stream
            return StreamingResponse(
                framed(fmt(req, engine.codec, source(), lambda: outcome, ids, rid)), media_type="text/event-stream"
            )
        async for _ in source():
            pass
        if chat:
            turn = assemble(engine.codec, outcome, forced_calls=req.tool_choice.forced)
            return Json(openai_api.chat_response(req, engine.codec, outcome, turn, ids, rid))
        turn = assemble(engine.codec, outcome, parse_tools=False)
        return Json(openai_api.completion_response(req, engine.codec, outcome, turn, ids, rid))

    async def chat_completions(request: Request) -> Response:
        return await _openai(request, True)

    async def completions(request: Request) -> Response:
        return await _openai(request, False)

    async def count_tokens(request: Request) -> Response:
        try:
            req = anthropic_api.count_tokens_request(await json_body(request))
        except (ApiError, ValueError) as err:
            e = err if isinstance(err, ApiError) else ApiError.invalid(str(err))
            return Json(anthropic_api.error_body(e), status_code=e.status)
        return Json({"input_tokens": len(engine.codec.render_ids(req.messages or [], req.tools))})

    return [
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
    ]
