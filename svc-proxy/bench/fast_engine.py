"""A fast stand-in for a GPU SGLang server (bench only): SGLang's native ``/generate`` and OpenAI chat, answering
at once with a fixed number of tokens, so the proxy's own overhead is what a benchmark measures.

    python svc-proxy/bench/fast_engine.py --tokens 16 --port-file /tmp/url
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from opengyre.asgi import HttpServer
from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer

enc = msgspec.json.Encoder()
dec = msgspec.json.Decoder()


def build(tokens: int) -> Starlette:
    codec = ChatCodec(load_tokenizer())
    reply = [*codec.encode("ok " * tokens)[: tokens - 1], codec.eos_id]

    def result(rid: str, n_prompt: int, ids: list[int], done: bool) -> dict[str, object]:
        fin = {"type": "stop", "matched": codec.eos_id} if done else None
        return {
            "text": "",
            "output_ids": ids,
            "meta_info": {
                "id": rid,
                "finish_reason": fin,
                "prompt_tokens": n_prompt,
                "completion_tokens": len(ids),
                "cached_tokens": 0,
                "weight_version": "default",
                "output_token_logprobs": [[-0.5, t, None] for t in ids],
            },
        }

    async def generate(request: Request) -> Response:
        body = dec.decode(await request.body())
        rid, n = body.get("rid", "x"), len(body["input_ids"])
        out = reply[: body.get("sampling_params", {}).get("max_new_tokens", tokens)]
        if not body.get("stream"):
            return Response(enc.encode(result(rid, n, out, True)), media_type="application/json")

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(1, len(out) + 1):
                yield b"data: " + enc.encode(result(rid, n, out[:i], i == len(out))) + b"\n\n"
            yield b"data: [DONE]\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    async def chat(request: Request) -> Response:
        body = dec.decode(await request.body())
        prompt = codec.render_ids(body["messages"], body.get("tools"))  # what SGLang does: template + tokenize
        text = codec.decode(reply)
        return Response(
            enc.encode(
                {
                    "id": "chatcmpl-x",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": text},
                            "finish_reason": "stop",
                            "logprobs": None,
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": len(reply),
                        "total_tokens": len(prompt) + len(reply),
                    },
                }
            ),
            media_type="application/json",
        )

    async def ok(request: Request) -> Response:
        return Response(enc.encode({"incremental_streaming_output": False}), media_type="application/json")

    return Starlette(
        routes=[
            Route("/generate", generate, methods=["POST"]),
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/server_info", ok, methods=["GET"]),
            Route("/health", ok, methods=["GET"]),
        ]
    )


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--port-file", type=Path, required=True)
    args = ap.parse_args()
    srv = HttpServer(build(args.tokens))
    await srv.start()
    args.port_file.write_text(srv.url + "\n")
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    await srv.stop()


if __name__ == "__main__":
    asyncio.run(main())
