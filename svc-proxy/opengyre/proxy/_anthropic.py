"""The Anthropic Messages dialect: requests (converted to chat-template messages), responses, SSE events, errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._assembly import Outcome, StreamAssembler, TextPiece, ToolPiece, Turn, arguments_object
from ._chat import ChatCodec
from ._errors import ApiError
from ._request import GenRequest, check_number
from ._sse import sse
from ._structured import ToolChoice
from ._tooldefs import ANTHROPIC_NAME, check_schema, check_tool_name

__all__ = [
    "context_error",
    "count_tokens_request",
    "error_body",
    "message_response",
    "message_stream",
    "parse_messages",
    "stream_error",
]


_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "not_found_error",
    "request_too_large": "request_too_large",
    "rate_limit": "rate_limit_error",
    "overloaded": "overloaded_error",
    "api_error": "api_error",
}


def error_body(err: ApiError, request_id: str | None = None) -> dict[str, Any]:
    return {
        "type": "error",
        "error": {"type": _ERROR_TYPES.get(err.kind, "invalid_request_error"), "message": err.message},
        "request_id": request_id or f"req_{uuid.uuid4().hex[:24]}",
    }


def stream_error(err: ApiError) -> bytes:
    """The event that ends a stream whose call failed after the 200 went out (the error a non-streamed call gets)."""
    kind = _ERROR_TYPES.get(err.kind, "api_error")
    return _event("error", {"type": "error", "error": {"type": kind, "message": err.message}})


def context_error(prompt_tokens: int, context_length: int, max_tokens: int | None) -> ApiError:
    if max_tokens is None:
        return ApiError.invalid(f"prompt is too long: {prompt_tokens} tokens > {context_length - 1} maximum")
    return ApiError.invalid(
        f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > {context_length}, "
        "decrease input length or `max_tokens` and try again"
    )


def _text_of(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError.invalid(f"{where}: content must be a string or a list of blocks")
    parts = []
    for b in content:
        if not isinstance(b, dict):
            raise ApiError.invalid(f"{where}: content blocks must be objects")
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
        else:
            raise ApiError.invalid(f"{where}: block type {b.get('type')!r} is not supported here (text only)")
    return "".join(parts)


def _system(raw: object) -> str | None:
    if raw is None:
        return None
    return _text_of(raw, "system")


def _convert_messages(raw: object, system: str | None) -> list[dict[str, Any]]:
    """Anthropic turns -> chat-template messages: tool_use blocks become tool_calls, tool_result blocks tool turns."""
    if not isinstance(raw, list) or not raw:
        raise ApiError.invalid("messages: must be a non-empty list")
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise ApiError.invalid(f"{where}.role: must be 'user' or 'assistant'")
        content = m.get("content")
        if isinstance(content, str):
            out.append({"role": m["role"], "content": content})
            continue
        if not isinstance(content, list):
            raise ApiError.invalid(f"{where}.content: must be a string or a list of blocks")
        if m["role"] == "assistant":
            text: list[str] = []
            calls: list[dict[str, Any]] = []
            for j, b in enumerate(content):
                t = b.get("type") if isinstance(b, dict) else None
                if t == "text":
                    text.append(str(b.get("text", "")))
                elif t == "tool_use":
                    if not isinstance(b.get("name"), str) or not isinstance(b.get("input", {}), dict):
                        raise ApiError.invalid(f"{where}.content.{j}: tool_use needs a name and an object input")
                    calls.append(
                        {
                            "id": str(b.get("id", "")),
                            "type": "function",
                            "function": {"name": b["name"], "arguments": json.dumps(b.get("input", {}))},
                        }
                    )
                elif t in ("thinking", "redacted_thinking"):
                    continue  # this template has no reasoning slot: thinking is not re-rendered
                else:
                    raise ApiError.invalid(f"{where}.content.{j}: block type {t!r} is not supported")
            msg: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
            if calls:
                msg["tool_calls"] = calls
            out.append(msg)
            continue
        user_text: list[str] = []
        for j, b in enumerate(content):
            t = b.get("type") if isinstance(b, dict) else None
            if t == "text":
                user_text.append(str(b.get("text", "")))
            elif t == "tool_result":
                if user_text:
                    out.append({"role": "user", "content": "".join(user_text)})
                    user_text = []
                rc = b.get("content", "")
                body = rc if isinstance(rc, str) else _text_of(rc, f"{where}.content.{j}.content")
                if b.get("is_error"):
                    body = f"Error: {body}"
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": body})
            else:
                raise ApiError.invalid(f"{where}.content.{j}: block type {t!r} is not supported by this model")
        if user_text:
            out.append({"role": "user", "content": "".join(user_text)})
    return out


def _tools(raw: object) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ApiError.invalid("tools: must be a list")
    out = []
    names: dict[str, str] = {}
    for i, t in enumerate(raw):
        if not isinstance(t, dict):
            raise ApiError.invalid(f"tools.{i}: must be an object")
        if t.get("type") not in (None, "custom"):
            raise ApiError.invalid(f"tools.{i}.type: server tool {t.get('type')!r} is not supported by this model")
        if "name" not in t:
            raise ApiError.invalid(f"tools.{i}.name: Field required")
        fn: dict[str, Any] = {"name": check_tool_name(t["name"], ANTHROPIC_NAME, f"tools.{i}.name", names)}
        if t.get("description"):
            fn["description"] = t["description"]
        if "input_schema" not in t:
            raise ApiError.invalid(f"tools.{i}.input_schema: Field required")
        fn["parameters"] = check_schema(t["input_schema"], f"tools.{i}.input_schema", require_object=True)
        out.append({"type": "function", "function": fn})
    return out or None


def _base(raw: object) -> tuple[dict[str, Any], str]:
    if not isinstance(raw, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("model: Field required")
    return raw, model


def parse_messages(raw: object) -> GenRequest:
    body, model = _base(raw)
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise ApiError.invalid("max_tokens: must be a positive integer")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError.invalid("stream: must be a boolean")
    req = GenRequest(dialect="anthropic", model=model, stream=stream, max_tokens=mt)
    req.messages = _convert_messages(body.get("messages"), _system(body.get("system")))
    req.tools = _tools(body.get("tools"))
    req.tool_choice = ToolChoice.anthropic(body, req.tools)
    thinking = body.get("thinking")
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled"):
            raise ApiError.invalid("thinking.type: must be 'enabled' or 'disabled'")
        if thinking["type"] == "enabled":
            # The served model's chat template has no reasoning format: no thinking block could be real.
            raise ApiError.invalid(f"thinking: model {model!r} does not support extended thinking")
    t = check_number(body, "temperature", 0.0, 1.0)
    if t is not None:
        req.sampling["temperature"] = t
    p = check_number(body, "top_p", 0.0, 1.0)
    if p is not None:
        req.sampling["top_p"] = max(p, 1e-9)
    tk = body.get("top_k")
    if tk is not None:
        if isinstance(tk, bool) or not isinstance(tk, int) or tk < 1:
            raise ApiError.invalid("top_k: must be a positive integer")
        req.sampling["top_k"] = tk
    # Non-Anthropic extras an RL harness may send (the vLLM names), e.g. through the SDK's extra_body.
    if body.get("ignore_eos") is not None:
        if not isinstance(body["ignore_eos"], bool):
            raise ApiError.invalid("ignore_eos: must be a boolean")
        req.sampling["ignore_eos"] = body["ignore_eos"]
    mn = body.get("min_tokens")
    if mn is not None:
        if isinstance(mn, bool) or not isinstance(mn, int) or mn < 0:
            raise ApiError.invalid("min_tokens: must be a non-negative integer")
        req.sampling["min_new_tokens"] = mn
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ApiError.invalid("stop_sequences: must be a list of strings")
        req.stop = [s for s in stops if s]
    return req


def count_tokens_request(raw: object) -> GenRequest:
    body, model = _base(raw)
    req = GenRequest(dialect="anthropic", model=model, stream=False)
    req.messages = _convert_messages(body.get("messages"), _system(body.get("system")))
    req.tools = _tools(body.get("tools"))
    return req


# --- responses ------------------------------------------------------------------------------------------


def _stop_reason(turn: Turn) -> str:
    if turn.finish == "length":
        return "max_tokens"
    if turn.finish == "tool_calls":
        return "tool_use"
    if turn.stop_string is not None:
        return "stop_sequence"
    return "end_turn"


def _partial_json(arguments: str) -> str:
    """The model's own argument text when it is a JSON object (no re-serialisation), else a wrapped form."""
    try:
        if isinstance(json.loads(arguments), dict):
            return arguments
    except ValueError:
        pass
    return json.dumps(arguments_object(arguments))


def _usage(prompt_tokens: int, output_tokens: int) -> dict[str, Any]:
    """Anthropic usage. The engine's prefix cache is not Anthropic's prompt caching (``cache_control`` blocks),
    so every prompt token is an input token, the same in ``message_start`` and at the end."""
    return {
        "input_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def message_response(
    req: GenRequest, codec: ChatCodec, outcome: Outcome, turn: Turn, prompt_ids: list[int], rid: str
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if turn.content:
        content.append({"type": "text", "text": turn.content})
    for t in turn.tool_calls:
        content.append({"type": "tool_use", "id": t.id, "name": t.name, "input": arguments_object(t.arguments)})
    return {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": _stop_reason(turn),
        "stop_sequence": turn.stop_string,
        "usage": _usage(len(prompt_ids), len(outcome.output_ids)),
    }


def _event(name: str, obj: dict[str, Any]) -> bytes:
    return sse(obj, name)


async def message_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: AsyncIterator[tuple[list[int], list[float]]],
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[bytes]:
    """message_start, (content_block_start, deltas, content_block_stop)*, message_delta, message_stop."""
    start_msg: dict[str, Any] = {
        "id": f"msg_{rid}",
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": _usage(len(prompt_ids), 0),
    }
    yield _event("message_start", {"type": "message_start", "message": start_msg})
    yield _event("ping", {"type": "ping"})
    asm = StreamAssembler(codec, req.stop, "toolu_", forced_calls=req.tool_choice.forced)
    index = -1
    text_open = False

    def emit(pieces: list[TextPiece | ToolPiece]) -> list[bytes]:
        nonlocal index, text_open
        out = []
        for p in pieces:
            if isinstance(p, TextPiece):
                if not text_open:
                    index += 1
                    text_open = True
                    out.append(
                        _event(
                            "content_block_start",
                            {
                                "type": "content_block_start",
                                "index": index,
                                "content_block": {"type": "text", "text": ""},
                            },
                        )
                    )
                out.append(
                    _event(
                        "content_block_delta",
                        {
                            "type": "content_block_delta",
                            "index": index,
                            "delta": {"type": "text_delta", "text": p.text},
                        },
                    )
                )
                continue
            if text_open:
                out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
                text_open = False
            index += 1
            c = p.call
            out.append(
                _event(
                    "content_block_start",
                    {
                        "type": "content_block_start",
                        "index": index,
                        "content_block": {"type": "tool_use", "id": c.id, "name": c.name, "input": {}},
                    },
                )
            )
            out.append(
                _event(
                    "content_block_delta",
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": _partial_json(c.arguments)},
                    },
                )
            )
            out.append(_event("content_block_stop", {"type": "content_block_stop", "index": index}))
        return out

    async for ids, _lps in source:
        for b in emit(asm.push(ids)):
            yield b
    final = outcome()
    if final.kind == "abort":
        return  # the caller ends the stream with the dialect's error event
    pieces, turn = asm.finish(final)
    for b in emit(pieces):
        yield b
    if text_open:
        yield _event("content_block_stop", {"type": "content_block_stop", "index": index})
    if on_turn is not None:
        r = on_turn(turn)
        if hasattr(r, "__await__"):
            await r
    usage = _usage(len(prompt_ids), len(final.output_ids))
    yield _event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(turn), "stop_sequence": turn.stop_string},
            "usage": usage,
        },
    )
    yield _event("message_stop", {"type": "message_stop"})
