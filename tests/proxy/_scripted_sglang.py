"""An SGLang-protocol engine whose replies are scripted: ``/generate`` (JSON or cumulative SSE, as SGLang
streams by default) answers each call with the next text of ``script(prompt_text)``, and ``/model_info``
reports the engine's own ``context_length`` (what SGLang serves, not its tokenizer's ``model_max_length``) and the
weight version it serves, which ``/update_weights_from_disk`` (what the trainer posts after a step) sets, as SGLang's
does: the replies carry it in ``meta_info.weight_version``. The weights themselves are never read: the script is
the policy."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer

__all__ = ["scripted_sglang"]

_enc = msgspec.json.Encoder()


def scripted_sglang(script: Callable[[str], str], *, context_length: int) -> tuple[Starlette, list[str]]:
    """The app, and the prompts it was sent (decoded), in order."""
    codec = ChatCodec(load_tokenizer())
    prompts: list[str] = []
    served = {"weight_version": "default"}

    def result(rid: str, n_prompt: int, ids: list[int], done: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": {"type": "stop", "matched": codec.eos_id} if done else None,
            "prompt_tokens": n_prompt,
            "completion_tokens": len(ids),
            "cached_tokens": 0,
            "weight_version": served["weight_version"],
            "output_token_logprobs": [[-0.5, t, None] for t in ids],
        }
        return {"text": codec.decode(ids), "output_ids": ids, "meta_info": meta}

    async def generate(request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        rid, prompt = body.get("rid", "x"), list(body["input_ids"])
        text = codec.decode(prompt)
        prompts.append(text)
        out = [*codec.encode(script(text)), codec.eos_id]
        out = out[: body.get("sampling_params", {}).get("max_new_tokens", len(out))]
        if not body.get("stream"):
            return Response(_enc.encode(result(rid, len(prompt), out, True)), media_type="application/json")

        async def chunks() -> AsyncIterator[bytes]:
            step = max(1, len(out) // 3)
            for i in [*range(step, len(out), step), len(out)]:
                yield b"data: " + _enc.encode(result(rid, len(prompt), out[:i], i == len(out))) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def server_info(request: Request) -> Response:
        return Response(_enc.encode({"incremental_streaming_output": False}), media_type="application/json")

    async def model_info(request: Request) -> Response:
        info = {
            "model_path": "scripted",
            "is_generation": True,
            "context_length": context_length,
            "weight_version": served["weight_version"],
        }
        return Response(_enc.encode(info), media_type="application/json")

    async def update_weights_from_disk(request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        if not isinstance(body, dict) or not body.get("model_path"):
            reply = {"success": False, "message": "model_path is required", "num_paused_requests": 0}
            return Response(_enc.encode(reply), status_code=400, media_type="application/json")
        served["weight_version"] = str(body.get("weight_version") or served["weight_version"])
        reply = {
            "success": True,
            "message": f"Succeeded to update model weights (weight_version={served['weight_version']}).",
            "num_paused_requests": 0,
        }
        return Response(_enc.encode(reply), media_type="application/json")

    app = Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/server_info", server_info, methods=["GET"]),
            Route("/model_info", model_info, methods=["GET"]),
            Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"]),
            Route("/health", server_info, methods=["GET"]),
        ]
    )
    return app, prompts
