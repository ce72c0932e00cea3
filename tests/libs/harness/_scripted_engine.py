"""A scripted policy behind SGLang's native ``/generate``: the real gateway in front renders, parses tool calls and
records, so the harness is tested over the real chat-completions protocol end to end.

A model cannot be made to follow a multi-step tool script cheaply, so the script stands in for the weights only:
each ``/generate`` takes the next reply text (``<tool_call>{...}</tool_call>`` for a tool call), tokenized with the
served tokenizer and sent with behaviour logprobs as SGLang does. ``BROKEN`` makes this and every later request
answer without logprobs, which the gateway refuses to record (502), as it would a broken GPU engine.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from opengyre.chat import ChatCodec
from opengyre.models import load_tokenizer

__all__ = ["BROKEN", "ScriptedEngine", "tool_call"]

BROKEN = "\x00broken"
_enc = msgspec.json.Encoder()


def tool_call(name: str, arguments: Any) -> str:
    """A Hermes-style tool call; ``arguments`` a dict (JSON object) or raw text (kept as the model's bytes)."""
    body = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return f'<tool_call>{{"name": "{name}", "arguments": {body}}}</tool_call>'


class ScriptedEngine:
    def __init__(self, replies: list[str]) -> None:
        self.codec = ChatCodec(load_tokenizer())
        self.replies = list(replies)
        self.prompts: list[str] = []  # every prompt it was given, decoded with special tokens
        self._broken = False

    async def generate(self, request: Request) -> Response:
        body = msgspec.json.decode(await request.body())
        assert not body.get("stream"), "the harness does not stream"
        ids = body["input_ids"]
        self.prompts.append(self.codec.decode(ids, skip_special=False))
        if self._broken or (self.replies and self.replies[0] == BROKEN):
            self._broken = True
            out = self.codec.encode("x")
            meta: dict[str, Any] = {"id": body.get("rid", "x"), "finish_reason": {"type": "stop", "matched": None}}
            return Response(_enc.encode({"text": "x", "output_ids": out, "meta_info": meta}))
        if not self.replies:
            return Response(b'{"error": "the script is exhausted"}', status_code=500)
        out = [*self.codec.encode(self.replies.pop(0)), self.codec.eos_id]
        meta = {
            "id": body.get("rid", "x"),
            "finish_reason": {"type": "stop", "matched": self.codec.eos_id},
            "prompt_tokens": len(ids),
            "completion_tokens": len(out),
            "cached_tokens": 0,
            "weight_version": "default",
            "output_token_logprobs": [[-0.5, t, None] for t in out],
        }
        text = self.codec.decode(out)
        return Response(
            _enc.encode({"text": text, "output_ids": out, "meta_info": meta}), media_type="application/json"
        )

    @property
    def app(self) -> Starlette:
        async def info(request: Request) -> Response:
            return Response(_enc.encode({"incremental_streaming_output": False}), media_type="application/json")

        return Starlette(
            routes=[
                Route("/generate", self.generate, methods=["POST"]),
                Route("/server_info", info, methods=["GET"]),
                Route("/health", info, methods=["GET"]),
            ]
        )
