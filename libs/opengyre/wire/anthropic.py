"""The Anthropic Messages dialect: requests (converted to chat-template messages), responses, SSE events, errors."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from opengyre.chat import ChatCodec

from ._assembly import Outcome, StreamAssembler, TextPiece, ToolPiece, Turn, arguments_object
from ._errors import ApiError
from ._request import GenRequest, check_number
from ._sse import Frame
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


def stream_error(err: ApiError) -> list[Frame]:
    """The event that ends a stream whose call failed after the 200 went out (the error a non-streamed call gets)."""
    kind = _ERROR_TYPES.get(err.kind, "api_error")
    return [_event("error", {"type": "error", "error": {"type": kind, "message": err.message}})]


def context_error(prompt_tokens: int, context_length: int, max_tokens: int | None) -> ApiError:
    if max_tokens is None:
        return ApiError.invalid(f"prompt is too long: {prompt_tokens} tokens > {context_length - 1} maximum")
    return ApiError.invalid(
        f"input length and `max_tokens` exceed context limit: {prompt_tokens} + {max_tokens} > {context_length}, "
        "decrease input length or `max_tokens` and try again"
    )


_IMAGE_KINDS = ("image", "document", "search_result", "container_upload")


def _refuse_media(kind: object, where: str) -> ApiError:
    if kind in _IMAGE_KINDS:
        return ApiError.invalid(f"{where}.type: {kind!r} content is not supported: the served model reads text only")
    return ApiError.invalid(f"{where}.type: block type {kind!r} is not supported by this model")


def _text_of(content: object, where: str) -> str:
    """A text-only content field: a string, or text blocks joined with a newline (blocks are separate passages:
    glued together, ``...header;`` and ``You are...`` would read as one line)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError.invalid(f"{where}: content must be a string or a list of blocks")
    parts = []
    for j, b in enumerate(content):
        if not isinstance(b, dict):
            raise ApiError.invalid(f"{where}: content blocks must be objects")
        if b.get("type") == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
        else:
            raise _refuse_media(b.get("type"), f"{where}.{j}")
    return "\n".join(parts)


def _system(raw: object) -> str | None:
    if raw is None:
        return None
    return _text_of(raw, "system")


def _tool_result_text(rc: object, where: str, loaded: set[str]) -> str:
    """A tool_result's content as text; ``tool_reference`` blocks (a tool search's answer) load the deferred tool
    they name and add no text: the vendor expands them into the tool's definition, which here joins the tools."""
    if isinstance(rc, str):
        return rc
    if not isinstance(rc, list):
        raise ApiError.invalid(f"{where}: content must be a string or a list of blocks")
    parts = []
    for k, b in enumerate(rc):
        t = b.get("type") if isinstance(b, dict) else None
        if t == "text" and isinstance(b.get("text"), str):
            parts.append(b["text"])
        elif t == "tool_reference" and isinstance(b.get("tool_name"), str):
            loaded.add(b["tool_name"])
        else:
            raise _refuse_media(t, f"{where}.{k}")
    return "\n".join(parts)


def _convert_messages(raw: object, system: str | None, loaded: set[str] | None = None) -> list[dict[str, Any]]:
    """Anthropic turns -> chat-template messages: tool_use blocks become tool_calls, tool_result blocks tool turns,
    and a ``system`` turn (the SDK's ``SystemMessageParam``; Claude Code sends them mid-conversation for updates
    and reminders) a system turn where it stands, so the model reads it where the harness put it."""
    if not isinstance(raw, list) or not raw:
        raise ApiError.invalid("messages: must be a non-empty list")
    loaded = set() if loaded is None else loaded
    out: list[dict[str, Any]] = []
    if system:
        out.append({"role": "system", "content": system})
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
            raise ApiError.invalid(f"{where}.role: must be 'user', 'assistant' or 'system'")
        content = m.get("content")
        if m["role"] == "system":
            out.append({"role": "system", "content": _text_of(content, f"{where}.content")})
            continue
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
                body = _tool_result_text(b.get("content", ""), f"{where}.content.{j}.content", loaded)
                if b.get("is_error"):
                    body = f"Error: {body}"
                out.append({"role": "tool", "tool_call_id": str(b.get("tool_use_id", "")), "content": body})
            else:
                raise _refuse_media(t, f"{where}.content.{j}")
        if user_text:
            out.append({"role": "user", "content": "".join(user_text)})
    return out


# Fields of a client tool (``ToolParam``) and what each does here.
_TOOL_FIELDS = {"name", "description", "input_schema", "type", "cache_control", "defer_loading", "strict"}
_TOOL_NO_EFFECT = {"eager_input_streaming", "allowed_callers"}  # streaming granularity; programmatic callers


def _tools(raw: object, loaded: set[str] | None = None) -> list[dict[str, Any]] | None:
    """Client tools in the chat template's function form. A ``defer_loading`` tool is left out (the vendor keeps
    it out of the prompt) until a ``tool_reference`` in the conversation loads it (``loaded``). Anthropic-defined
    and server tools (``web_search_*``, ``bash_*``, ``code_execution_*``, ``tool_search_tool_*``, ...) are refused:
    the vendor runs them or supplies their schema, neither of which this server can."""
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
            raise ApiError.invalid(
                f"tools.{i}.type: {t.get('type')!r} is a tool the vendor runs or defines, which this server cannot "
                "(client tools with an input_schema only)"
            )
        if "name" not in t:
            raise ApiError.invalid(f"tools.{i}.name: Field required")
        extra = sorted(set(t) - _TOOL_FIELDS - _TOOL_NO_EFFECT)
        if extra:
            raise ApiError.invalid(f"tools.{i}.{extra[0]}: Extra inputs are not permitted")
        fn: dict[str, Any] = {"name": check_tool_name(t["name"], ANTHROPIC_NAME, f"tools.{i}.name", names)}
        if t.get("description"):
            fn["description"] = t["description"]
        if "input_schema" not in t:
            raise ApiError.invalid(f"tools.{i}.input_schema: Field required")
        fn["parameters"] = check_schema(t["input_schema"], f"tools.{i}.input_schema", require_object=True)
        deferred = t.get("defer_loading", False)
        if not isinstance(deferred, bool):
            raise ApiError.invalid(f"tools.{i}.defer_loading: Input should be a valid boolean")
        if deferred and fn["name"] not in (loaded or set()):
            continue
        out.append({"type": "function", "function": fn})
    return out or None


def _base(raw: object) -> tuple[dict[str, Any], str]:
    if not isinstance(raw, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    model = raw.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("model: Field required")
    return raw, model


# Every top-level field of MessageCreateParams (anthropic 0.121, with its betas' fields), plus the vLLM-named
# extras an RL harness may send; anything else is the vendor's 400 "Extra inputs are not permitted".
_MESSAGE_FIELDS = {
    "model", "max_tokens", "messages", "system", "stop_sequences", "temperature", "top_p", "top_k", "stream",
    "tools", "tool_choice", "metadata", "thinking", "service_tier", "cache_control", "output_config",
    "context_management", "container", "mcp_servers", "inference_geo", "speed", "diagnostics",
    "ignore_eos", "min_tokens",
}  # fmt: skip
_COUNT_FIELDS = {
    "model", "messages", "system", "tools", "tool_choice", "thinking", "cache_control", "output_config",
    "context_management", "mcp_servers", "speed",
}  # fmt: skip
_EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(set(body) - allowed)
    if extra:
        raise ApiError.invalid(f"{extra[0]}: Extra inputs are not permitted")


def _options(body: dict[str, Any], req: GenRequest, model: str) -> None:
    """The fields that do not change the rendered prompt: honoured, refused as the vendor refuses what a model
    cannot do, or accepted with no effect here (``req.no_effect``, recorded with the call)."""
    thinking = body.get("thinking")
    if thinking is not None:
        kind = thinking.get("type") if isinstance(thinking, dict) else None
        if kind not in ("enabled", "disabled", "adaptive"):
            raise ApiError.invalid("thinking.type: must be 'enabled', 'disabled' or 'adaptive'")
        if kind == "enabled":
            # The served model's chat template has no reasoning format: no thinking block could be real.
            raise ApiError.invalid(f"thinking: model {model!r} does not support extended thinking")
        if kind == "adaptive":
            if thinking.get("display") not in (None, "summarized", "omitted"):
                raise ApiError.invalid("thinking.display: must be 'summarized' or 'omitted'")
            req.no_effect["thinking"] = "adaptive: the model decides whether to think, and this one has no reasoning"
    oc = body.get("output_config")
    if oc is not None:
        if not isinstance(oc, dict) or set(oc) - {"effort", "format"}:
            raise ApiError.invalid("output_config: only 'effort' and 'format' are accepted")
        effort = oc.get("effort")
        if effort is not None:
            if effort not in _EFFORTS:
                raise ApiError.invalid(f"output_config.effort: must be one of {', '.join(_EFFORTS)}")
            req.no_effect["output_config.effort"] = f"{effort}: the served model has no effort control"
        fmt = oc.get("format")
        if fmt is not None:
            if not isinstance(fmt, dict) or fmt.get("type") != "json_schema" or "schema" not in fmt:
                raise ApiError.invalid("output_config.format: must be {'type': 'json_schema', 'schema': ...}")
            req.json_schema = check_schema(fmt["schema"], "output_config.format.schema", require_object=False)
    cm = body.get("context_management")
    if cm is not None:
        edits = cm.get("edits", []) if isinstance(cm, dict) else None
        if not isinstance(edits, list):
            raise ApiError.invalid("context_management.edits: must be a list")
        for k, e in enumerate(edits):
            kind = e.get("type") if isinstance(e, dict) else None
            if kind != "clear_thinking_20251015":
                # Clearing tool results or compacting rewrites the prompt past a trigger; not done here.
                raise ApiError.invalid(f"context_management.edits.{k}.type: {kind!r} is not supported")
        if edits:
            req.no_effect["context_management"] = "clear_thinking: thinking blocks are never rendered here"
    for key in ("container", "mcp_servers"):
        if body.get(key) is not None:
            raise ApiError.invalid(f"{key}: not supported: this server runs no vendor-hosted tools or MCP servers")
    md = body.get("metadata")
    if md is not None:
        if not isinstance(md, dict) or set(md) - {"user_id"}:
            raise ApiError.invalid("metadata: only 'user_id' is accepted")
        req.no_effect["metadata"] = "the caller's label; it does not change the answer"
    if body.get("service_tier") not in (None, "auto", "standard_only"):
        raise ApiError.invalid("service_tier: must be 'auto' or 'standard_only'")
    if body.get("speed") not in (None, "standard", "fast"):
        raise ApiError.invalid("speed: must be 'standard' or 'fast'")
    for key, why in (
        ("service_tier", "one capacity pool"),
        ("cache_control", "the engine's prefix cache is automatic"),
        ("inference_geo", "one location"),
        ("speed", "one speed"),
        ("diagnostics", "no prompt-cache diagnostics"),
    ):
        if body.get(key) is not None:
            req.no_effect[key] = why


def _deferred_loads(body: dict[str, Any]) -> set[str]:
    """The deferred tools a tool search loaded so far (``tool_reference`` blocks in tool results)."""
    loaded: set[str] = set()
    msgs = body.get("messages")
    if isinstance(msgs, list):
        for m in msgs:
            content = m.get("content") if isinstance(m, dict) else None
            for b in content if isinstance(content, list) else []:
                rc = b.get("content") if isinstance(b, dict) and b.get("type") == "tool_result" else None
                for r in rc if isinstance(rc, list) else []:
                    if (
                        isinstance(r, dict)
                        and r.get("type") == "tool_reference"
                        and isinstance(r.get("tool_name"), str)
                    ):
                        loaded.add(r["tool_name"])
    return loaded


def parse_messages(raw: object) -> GenRequest:
    body, model = _base(raw)
    _check_fields(body, _MESSAGE_FIELDS)
    mt = body.get("max_tokens")
    if isinstance(mt, bool) or not isinstance(mt, int) or mt < 1:
        raise ApiError.invalid("max_tokens: must be a positive integer")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise ApiError.invalid("stream: must be a boolean")
    req = GenRequest(dialect="anthropic", model=model, stream=stream, max_tokens=mt)
    loaded = _deferred_loads(body)
    req.messages = _convert_messages(body.get("messages"), _system(body.get("system")), loaded)
    req.tools = _tools(body.get("tools"), loaded)
    req.tool_choice = ToolChoice.anthropic(body, req.tools)
    _options(body, req, model)
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
    _check_fields(body, _COUNT_FIELDS)
    req = GenRequest(dialect="anthropic", model=model, stream=False)
    loaded = _deferred_loads(body)
    req.messages = _convert_messages(body.get("messages"), _system(body.get("system")), loaded)
    req.tools = _tools(body.get("tools"), loaded)
    req.tool_choice = ToolChoice.anthropic(body, req.tools)
    _options(body, req, model)
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


def _event(name: str, obj: dict[str, Any]) -> Frame:
    return Frame(obj, name)


async def message_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: AsyncIterator[tuple[list[int], list[float]]],
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[Frame]:
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

    def emit(pieces: list[TextPiece | ToolPiece]) -> list[Frame]:
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
