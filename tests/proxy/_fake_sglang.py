"""A stand-in for a GPU SGLang server speaking its native ``/generate`` protocol, with a fault to inject.

``logprobs`` says what it does with the behaviour logprobs the proxy asks for (``return_logprob``): ``"ok"``
sends them as SGLang does (``meta_info.output_token_logprobs = [[logprob, id, null], ...]``), ``"missing"``
leaves the field out, ``"null"`` sends ``null`` in place of each logprob, ``"positive"`` sends ``POSITIVE`` (no
log probability), ``"noise"`` sends ``NOISE`` (float noise above 0, as a float32 log-softmax of a certain token
can give).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer

__all__ = ["LOGPROB", "NOISE", "POSITIVE", "fake_sglang"]

LOGPROB = -0.25
POSITIVE = 0.7
NOISE = 5e-7
_SENT = {"ok": LOGPROB, "null": None, "positive": POSITIVE, "noise": NOISE}
_enc = msgspec.json.Encoder()


def fake_sglang(logprobs: Literal["ok", "missing", "null", "positive", "noise"]) -> Starlette:
    codec = ChatCodec(load_tokenizer())
    reply = [*codec.encode("fine"), codec.eos_id]

    def result(rid: str, n_prompt: int, ids: list[int], done: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": codec.eos_id} if done else None,
            "prompt_tokens": n_prompt,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": "default",
        }
        if logprobs != "missing":
            meta["output_token_logprobs"] = [[_SENT[logprobs], t, None] for t in ids]
        return {"text": codec.decode(ids), "output_ids": ids, "meta_info": meta}

    async def generate(request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        rid, n = body.get("rid", "x"), len(body["input_ids"])
        out = reply[: body.get("sampling_params", {}).get("max_new_tokens", len(reply))]
        if not body.get("stream"):
            return Response(_enc.encode(result(rid, n, out, True)), media_type="application/json")

        async def chunks() -> AsyncIterator[bytes]:  # cumulative, as SGLang streams by default
            for i in range(1, len(out) + 1):
                yield b"data: " + _enc.encode(result(rid, n, out[:i], i == len(out))) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def ok(request: Request) -> Response:
        return Response(_enc.encode({"incremental_streaming_output": False}), media_type="application/json")

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/server_info", ok, methods=["GET"]),
            Route("/health", ok, methods=["GET"]),
        ]
    )
