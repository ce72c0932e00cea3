"""The OpenAI dialect: Chat Completions and Completions requests, responses, SSE chunks and errors."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from opengyre.chat import ChatCodec

from ._assembly import Outcome, StreamAssembler, TextPiece, ToolPiece, Turn
from ._errors import ApiError
from ._request import GenRequest, check_number, content_text
from ._sse import DONE, Frame
from ._structured import ToolChoice, response_format_schema
from ._tooldefs import OPENAI_NAME, check_schema, check_tool_name

__all__ = [
    "chat_logprobs_content",
    "chat_response",
    "chat_stream",
    "completion_response",
    "completion_stream",
    "context_error",
    "error_body",
    "models_body",
    "parse_chat",
    "parse_completion",
    "stream_error",
]


MAX_N = 16  # samples per call (each is a call of its own on the engines and in the record)
MAX_TOKEN_ID = 2**31  # past every vocabulary; engines hold token ids as int32, where a larger one is a crash


def _token_id(t: object) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and 0 <= t < MAX_TOKEN_ID


_ERROR_TYPES = {
    "invalid_request": "invalid_request_error",
    "authentication": "authentication_error",
    "permission": "permission_error",
    "not_found": "invalid_request_error",
    "request_too_large": "invalid_request_error",
    "rate_limit": "rate_limit_error",
    "overloaded": "server_error",
    "api_error": "server_error",
}

_ROLES = {"system", "developer", "user", "assistant", "tool"}


def error_body(err: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": err.message,
            "type": _ERROR_TYPES.get(err.kind, "invalid_request_error"),
            "param": err.param,
            "code": err.code,
        }
    }


def stream_error(err: ApiError) -> list[Frame]:
    """The frames that end a stream whose call failed after the 200 went out: the error body a non-streamed call
    gets (the SDK raises on a ``data:`` object with an ``error`` key), then ``[DONE]``."""
    return [Frame(error_body(err)), DONE]


def context_error(prompt_tokens: int, context_length: int, max_tokens: int | None) -> ApiError:
    if max_tokens is None:
        msg = (
            f"This model's maximum context length is {context_length} tokens. However, your messages "
            f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
        )
    else:
        msg = (
            f"This model's maximum context length is {context_length} tokens. However, you requested "
            f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} in the "
            "completion). Please reduce the length of the messages or completion."
        )
    return ApiError.invalid(msg, param="messages", code="context_length_exceeded")


def models_body(names: list[str]) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [{"id": n, "object": "model", "created": 0, "owned_by": "opengyre"} for n in names],
    }


def _common_sampling(body: dict[str, Any], req: GenRequest) -> None:
    s = req.sampling
    for key, lo, hi in (
        ("temperature", 0.0, 2.0),
        ("top_p", 0.0, 1.0),
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
        ("min_p", 0.0, 1.0),
        ("repetition_penalty", 0.0, 2.0),
    ):
        v = check_number(body, key, lo, hi)
        if v is not None:
            s[key] = v
    if s.get("top_p") == 0.0:
        s["top_p"] = 1e-9
    if body.get("top_k") is not None:
        tk = body["top_k"]
        if isinstance(tk, bool) or not isinstance(tk, int) or tk == 0 or tk < -1:
            raise ApiError.invalid("'top_k' must be -1 or a positive integer", param="top_k")
        s["top_k"] = tk
    seed = body.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63:
            raise ApiError.invalid("'seed' must be a 64-bit integer", param="seed")
        s["sampling_seed"] = seed
    bias = body.get("logit_bias")
    if bias is not None:
        if not isinstance(bias, dict):
            raise ApiError.invalid("'logit_bias' must be an object", param="logit_bias")
        for k, v in bias.items():
            if not (k.isdigit() and _token_id(int(k))) or isinstance(v, bool) or not isinstance(v, int | float):
                raise ApiError.invalid(
                    f"'logit_bias' maps token ids in [0, {MAX_TOKEN_ID}) to numbers; got {k[:40]!r}", param="logit_bias"
                )
        s["logit_bias"] = bias
    for key in ("ignore_eos", "skip_special_tokens"):
        if body.get(key) is not None:
            if not isinstance(body[key], bool):
                raise ApiError.invalid(f"'{key}' must be a boolean", param=key)
            s[key] = body[key]
    if body.get("min_tokens") is not None:
        mt = body["min_tokens"]
        if isinstance(mt, bool) or not isinstance(mt, int) or mt < 0:
            raise ApiError.invalid("'min_tokens' must be a non-negative integer", param="min_tokens")
        s["min_new_tokens"] = mt
    if body.get("stop_token_ids") is not None:
        ids = body["stop_token_ids"]
        if not isinstance(ids, list) or not all(_token_id(i) for i in ids):
            raise ApiError.invalid(
                f"'stop_token_ids' must be a list of token ids in [0, {MAX_TOKEN_ID})", param="stop_token_ids"
            )
        s["stop_token_ids"] = ids
    stop = body.get("stop")
    if stop is not None:
        if isinstance(stop, str):
            req.stop = [stop] if stop else []  # as in a list: "" stops nothing (SGLang would stop at once)
        elif isinstance(stop, list) and all(isinstance(x, str) for x in stop) and len(stop) <= 4:
            req.stop = [x for x in stop if x]
        else:
            raise ApiError.invalid("'stop' must be a string or a list of up to 4 strings", param="stop")
    n = body.get("n")
    if n is not None:
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ApiError.invalid(f"'n' must be an integer in [1, {MAX_N}]", param="n")
        req.n = n
    so = body.get("stream_options")
    if so is not None:
        if not isinstance(so, dict):
            raise ApiError.invalid("'stream_options' must be an object", param="stream_options")
        req.include_usage = bool(so.get("include_usage"))
    if body.get("return_token_ids") is not None:
        req.return_token_ids = bool(body["return_token_ids"])


def _max_tokens(body: dict[str, Any], *keys: str) -> int | None:
    vals = []
    for key in keys:
        v = body.get(key)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ApiError.invalid(f"'{key}' must be a positive integer", param=key)
        vals.append(v)
    return min(vals) if vals else None


def _model_and_stream(body: object) -> tuple[dict[str, Any], str, bool]:
    if not isinstance(body, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("you must provide a model parameter", param="model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError.invalid("'stream' must be a boolean", param="stream")
    return body, model, bool(stream)


def _tools(body: dict[str, Any]) -> list[dict[str, Any]] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise ApiError.invalid("'tools' must be a list", param="tools")
    out = []
    names: dict[str, str] = {}
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise ApiError.invalid(f"tools[{i}] must be a function tool", param=f"tools[{i}]")
        check_tool_name(fn.get("name"), OPENAI_NAME, f"tools[{i}].function.name", names)
        if fn.get("parameters") is not None:
            check_schema(fn["parameters"], f"tools[{i}].function.parameters", require_object=False)
        out.append({"type": "function", "function": fn})
    return out or None


def _message(i: int, m: object) -> dict[str, Any]:
    p = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ApiError.invalid(f"'{p}' must be an object", param=p)
    role = m.get("role")
    if role not in _ROLES:
        raise ApiError.invalid(f"'{p}.role' must be one of {sorted(_ROLES)}", param=f"{p}.role")
    out: dict[str, Any] = {"role": "system" if role == "developer" else role}
    out["content"] = content_text(m.get("content"), param=f"{p}.content")
    if role == "assistant" and m.get("tool_calls"):
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            raise ApiError.invalid(f"'{p}.tool_calls' must be a list", param=f"{p}.tool_calls")
        norm = []
        for j, tc in enumerate(calls):
            fn = tc.get("function") if isinstance(tc, dict) else None
            if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
                raise ApiError.invalid(f"'{p}.tool_calls[{j}]' is malformed", param=f"{p}.tool_calls[{j}]")
            args = fn.get("arguments", "")
            if not isinstance(args, str):
                args = json.dumps(args)
            norm.append(
                {"id": str(tc.get("id", "")), "type": "function", "function": {"name": fn["name"], "arguments": args}}
            )
        out["tool_calls"] = norm
    if role == "tool":
        call_id = m.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            # OpenAI requires it: without it the result cannot be tied to its call (never invent one)
            raise ApiError.invalid(f"'{p}.tool_call_id' is required on a tool message", param=f"{p}.tool_call_id")
        out["tool_call_id"] = call_id
    return out


_CHAT_EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")

# The engine-side extras both APIs take (vLLM's and SGLang's names, what RL harnesses send), read in
# ``_common_sampling``.
_ENGINE_EXTRAS = {
    "top_k", "min_p", "repetition_penalty", "ignore_eos", "skip_special_tokens", "min_tokens", "stop_token_ids",
    "return_token_ids",
}  # fmt: skip
# Every top-level field of the SDK's ChatCompletionCreateParams and CompletionCreateParams (openai 2.x, deprecated
# ones included) plus those extras: each is honoured, refused, or recorded as no-effect. Anything else is OpenAI's
# 400 "Unrecognized request argument supplied", never ignored (a misspelt 'max_tokens' would change the answer).
_CHAT_FIELDS = _ENGINE_EXTRAS | {
    "model", "messages", "stream", "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
    "logprobs", "max_completion_tokens", "max_tokens", "metadata", "modalities", "moderation", "n",
    "parallel_tool_calls", "prediction", "presence_penalty", "prompt_cache_key", "prompt_cache_options",
    "prompt_cache_retention", "reasoning_effort", "response_format", "safety_identifier", "seed", "service_tier",
    "stop", "store", "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p", "user",
    "verbosity", "web_search_options",
}  # fmt: skip
_COMPLETION_FIELDS = _ENGINE_EXTRAS | {
    "model", "prompt", "stream", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "max_tokens", "n",
    "presence_penalty", "seed", "stop", "stream_options", "suffix", "temperature", "top_p", "user",
}  # fmt: skip


def _check_fields(body: dict[str, Any], allowed: set[str]) -> None:
    extra = sorted(k for k in body if k not in allowed)
    if extra:
        raise ApiError.invalid(f"Unrecognized request argument supplied: {extra[0]}", param=extra[0])


# Chat fields this server cannot honour; ignoring them would change what the model is shown or asked for.
_CHAT_REFUSED = {
    "functions": "the deprecated 'functions' are not supported: send 'tools'",
    "function_call": "the deprecated 'function_call' is not supported: send 'tool_choice'",
    "audio": "audio output is not supported: the served model writes text only",
    "prediction": "predicted outputs are not supported",
    "web_search_options": "web search is a hosted tool this server cannot run",
    "moderation": "moderation is not run here: a 'block' policy could not be honoured",
}


def _chat_no_effect(body: dict[str, Any], req: GenRequest) -> None:
    """Chat fields OpenCode, litellm and the SDK send that change nothing on this engine (``req.no_effect``);
    the ones that would change something and cannot be honoured are 400."""
    for key, why in _CHAT_REFUSED.items():
        if body.get(key) is not None:
            raise ApiError.invalid(f"'{key}': {why}", param=key)
    modalities = body.get("modalities")
    if modalities is not None and modalities != ["text"]:
        raise ApiError.invalid("'modalities': only ['text'] is supported", param="modalities")
    if body.get("reasoning_effort") not in _CHAT_EFFORTS:
        raise ApiError.invalid(f"'reasoning_effort' must be one of {_CHAT_EFFORTS[1:]}", param="reasoning_effort")
    if body.get("verbosity") not in (None, "low", "medium", "high"):
        raise ApiError.invalid("'verbosity' must be low, medium or high", param="verbosity")
    for key, why in (
        ("reasoning_effort", "the served model has no reasoning"),
        ("verbosity", "the served model has no verbosity control"),
        ("user", "the caller's label"),
        ("safety_identifier", "the caller's label"),
        ("metadata", "the caller's labels"),
        ("store", "the call is recorded for training whatever store says"),
        ("prompt_cache_key", "the engine's prefix cache is automatic"),
        ("prompt_cache_options", "the engine's prefix cache is automatic"),
        ("prompt_cache_retention", "the engine's prefix cache is automatic"),
        ("service_tier", "one capacity pool"),
    ):
        if body.get(key) is not None:
            req.no_effect[key] = why


def parse_chat(raw: object, extra: frozenset[str] = frozenset()) -> GenRequest:
    """``extra``: further top-level fields the caller reads itself (an engine's ``request_id``)."""
    body, model, stream = _model_and_stream(raw)
    _check_fields(body, _CHAT_FIELDS | extra)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ApiError.invalid("'messages' must be a non-empty list", param="messages")
    req = GenRequest(dialect="openai-chat", model=model, stream=stream)
    req.messages = [_message(i, m) for i, m in enumerate(msgs)]
    req.tools = _tools(body)
    req.tool_choice = ToolChoice.openai(body, req.tools)
    req.json_schema = response_format_schema(body.get("response_format"))
    req.max_tokens = _max_tokens(body, "max_tokens", "max_completion_tokens")
    _common_sampling(body, req)
    _chat_no_effect(body, req)
    lp = body.get("logprobs")
    req.logprobs = bool(lp)
    tl = body.get("top_logprobs")
    if tl is not None:
        if isinstance(tl, bool) or not isinstance(tl, int) or not 0 <= tl <= 20:
            raise ApiError.invalid("'top_logprobs' must be an integer in [0, 20]", param="top_logprobs")
        if not req.logprobs:
            raise ApiError.invalid("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        req.top_logprobs = tl
    return req


def parse_completion(raw: object, extra: frozenset[str] = frozenset()) -> GenRequest:
    """``extra``: further top-level fields the caller reads itself (an engine's ``request_id``)."""
    body, model, stream = _model_and_stream(raw)
    _check_fields(body, _COMPLETION_FIELDS | extra)
    prompt = body.get("prompt")
    req = GenRequest(dialect="openai-completions", model=model, stream=stream)
    if isinstance(prompt, str):
        req.prompt_text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(_token_id(t) for t in prompt):
            raise ApiError.invalid(f"'prompt' token ids must be integers in [0, {MAX_TOKEN_ID})", param="prompt")
        req.prompt_ids = list(prompt)
    elif isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        req.prompt_text = prompt[0]
    else:
        raise ApiError.invalid("'prompt' must be a string or a list of token ids (one prompt)", param="prompt")
    req.max_tokens = _max_tokens(body, "max_tokens")
    if req.max_tokens is None and body.get("max_tokens") is None:
        req.max_tokens = 16  # the Completions API's documented default
        req.max_tokens_explicit = False
    _common_sampling(body, req)
    lp = body.get("logprobs")
    if lp is not None:
        if isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 5:
            raise ApiError.invalid("'logprobs' must be an integer in [0, 5]", param="logprobs")
        req.logprobs = True
        req.top_logprobs = lp
    req.echo = bool(body.get("echo"))
    if body.get("user") is not None:
        req.no_effect["user"] = "the caller's label"
    # What this server cannot honour is refused, not ignored: best_of ranks extra samples server-side, suffix asks
    # for insertion, and echo with logprobs asks for the prompt's logprobs too (only the completion's are known).
    best_of = body.get("best_of")
    if best_of is not None and best_of != req.n:
        raise ApiError.invalid("'best_of' other than 'n' is not supported", param="best_of")
    suffix = body.get("suffix")
    if suffix not in (None, ""):
        raise ApiError.invalid("'suffix' (insertion) is not supported", param="suffix")
    if req.echo and lp is not None:
        raise ApiError.invalid("'echo' with 'logprobs' (the prompt's logprobs) is not supported", param="echo")
    return req


# --- responses ------------------------------------------------------------------------------------------


def _usage(prompt_tokens: int, completion_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }


def _openai_finish(turn: Turn) -> str:
    return "length" if turn.finish == "length" else turn.finish if turn.finish == "tool_calls" else "stop"


def _token_str(codec: ChatCodec, tid: int) -> str:
    """A token as OpenAI shows it: its text, or ``bytes:\\xNN`` for part of a character (as OpenAI does)."""
    text = codec.decode([tid], skip_special=False)
    if "\ufffd" in text:
        raw = codec.token_bytes(tid)
        if raw != text.encode():
            return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
    return text


def _token_entry(codec: ChatCodec, tid: int, lp: float) -> dict[str, Any]:
    return {"token": _token_str(codec, tid), "logprob": lp, "bytes": list(codec.token_bytes(tid))}


def chat_logprobs_content(
    codec: ChatCodec, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], k: int
) -> list[dict[str, Any]]:
    """Per token: its text, bytes, logprob and ``k`` most likely alternatives (Chat and Responses share it)."""
    content = []
    for tid, lp, top in zip(ids, lps, tops, strict=False):
        entry = _token_entry(codec, tid, lp)
        entry["top_logprobs"] = [_token_entry(codec, t, v) for t, v in top[:k]]
        content.append(entry)
    return content


def _chat_logprobs(
    codec: ChatCodec, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], k: int
) -> dict[str, Any]:
    return {"content": chat_logprobs_content(codec, ids, lps, tops, k)}


def _tool_calls_json(turn: Turn) -> list[dict[str, Any]]:
    return [
        {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
        for t in turn.tool_calls
    ]


def chat_response(
    req: GenRequest, codec: ChatCodec, outcome: Outcome, turn: Turn, prompt_ids: list[int], rid: str
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.content or None, "refusal": None}
    if turn.tool_calls:
        message["tool_calls"] = _tool_calls_json(turn)
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": _chat_logprobs(
            codec, outcome.output_ids, outcome.output_logprobs, outcome.top_for(outcome.output_ids), req.top_logprobs
        )
        if req.logprobs
        else None,
        "finish_reason": _openai_finish(turn),
    }
    out: dict[str, Any] = {
        "id": f"chatcmpl-{rid}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": f"weights-{outcome.weight_version}",
        "choices": [choice],
        "usage": _usage(len(prompt_ids), len(outcome.output_ids), outcome.cached_tokens),
    }
    if req.return_token_ids:
        out["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = outcome.output_ids
    return out


TokenSource = AsyncIterator[tuple[list[int], list[float]]]


async def chat_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: TokenSource,
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[Frame]:
    """SSE chunks for ``source``'s token deltas; ``outcome()`` is read once the source is exhausted.

    ``on_turn`` runs after the last token and before the final chunks (the proxy records the call there).
    """
    created = int(time.time())
    head = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": created, "model": req.model}
    head["system_fingerprint"] = None

    def chunk(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> Frame:
        c: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return Frame({**head, "choices": [c], "usage": None})

    first: dict[str, Any] = {"role": "assistant", "content": ""}
    if req.return_token_ids:
        yield Frame(
            {
                **head,
                "choices": [{"index": 0, "delta": first, "logprobs": None, "finish_reason": None}],
                "usage": None,
                "prompt_token_ids": prompt_ids,
            }
        )
    else:
        yield chunk(first)
    asm = StreamAssembler(codec, req.stop, "call_", forced_calls=req.tool_choice.forced)

    def pieces_out(pieces: list[TextPiece | ToolPiece]) -> list[Frame]:
        out = []
        for p in pieces:
            if isinstance(p, TextPiece):
                out.append(chunk({"content": p.text}))
            else:
                c = p.call
                out.append(
                    chunk(
                        {
                            "tool_calls": [
                                {
                                    "index": p.index,
                                    "id": c.id,
                                    "type": "function",
                                    "function": {"name": c.name, "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                out.append(chunk({"tool_calls": [{"index": p.index, "function": {"arguments": c.arguments}}]}))
        return out

    async for ids, lps in source:
        pieces = asm.push(ids)
        if req.logprobs and ids:
            # Logprobs ride on their own empty-content chunk so text hold-back cannot misalign them.
            tops = outcome().top_for(ids)
            yield chunk({"content": ""}, logprobs=_chat_logprobs(codec, ids, lps, tops, req.top_logprobs))
        for b in pieces_out(pieces):
            yield b
    final = outcome()
    if final.kind == "abort":
        return  # the caller ends the stream with the dialect's error event
    pieces, turn = asm.finish(final)
    for b in pieces_out(pieces):
        yield b
    if on_turn is not None:
        await _maybe_await(on_turn(turn))
    last: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": _openai_finish(turn)}
    if req.return_token_ids:
        last["token_ids"] = final.output_ids
    yield Frame({**head, "choices": [last], "usage": None})
    if req.include_usage:
        usage = _usage(len(prompt_ids), len(final.output_ids), final.cached_tokens)
        yield Frame({**head, "choices": [], "usage": usage})
    yield DONE


async def _maybe_await(x: Any) -> None:
    if hasattr(x, "__await__"):
        await x


def _completion_logprobs(
    codec: ChatCodec, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]], k: int, offset: int
) -> dict[str, Any]:
    """Legacy logprobs: per token, the ``k`` most likely tokens and the chosen one (as OpenAI documents)."""
    tokens = [_token_str(codec, t) for t in ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    alternatives = []
    for tok, lp, top in zip(tokens, lps, tops, strict=False):
        alt = {_token_str(codec, t): v for t, v in top[:k]}
        alt.setdefault(tok, lp)
        alternatives.append(alt)
    return {"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": alternatives}


def completion_response(
    req: GenRequest, codec: ChatCodec, outcome: Outcome, turn: Turn, prompt_ids: list[int], rid: str
) -> dict[str, Any]:
    text = turn.content
    finish = "length" if outcome.kind == "length" else "stop"
    prefix = codec.decode(prompt_ids) if req.echo else ""
    choice: dict[str, Any] = {
        "index": 0,
        "text": prefix + text,
        "finish_reason": finish,
        "stop_reason": outcome.stop_string,
        "logprobs": _completion_logprobs(
            codec,
            outcome.output_ids,
            outcome.output_logprobs,
            outcome.top_for(outcome.output_ids),
            req.top_logprobs,
            len(prefix),
        )
        if req.logprobs
        else None,
    }
    if req.return_token_ids:
        choice["prompt_token_ids"] = prompt_ids
        choice["token_ids"] = outcome.output_ids
    return {
        "id": f"cmpl-{rid}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": req.model,
        "system_fingerprint": f"weights-{outcome.weight_version}",
        "choices": [choice],
        "usage": _usage(len(prompt_ids), len(outcome.output_ids), outcome.cached_tokens),
    }


async def completion_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: TokenSource,
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[Frame]:
    created = int(time.time())
    head = {"id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": req.model}
    asm = StreamAssembler(codec, req.stop, "call_", parse_tools=False)
    first = True

    def chunk(text: str, finish: str | None = None, **extra: Any) -> Frame:
        c: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        c.update(extra)
        return Frame({**head, "choices": [c], "usage": None})

    if req.echo:
        yield chunk(codec.decode(prompt_ids))
    offset = 0
    async for ids, lps in source:
        text = "".join(p.text if isinstance(p, TextPiece) else "" for p in asm.push(ids))
        extra: dict[str, Any] = {}
        if req.return_token_ids:
            # vLLM's shape: the prompt's ids once, in the first chunk; every chunk carries its delta ids.
            extra["token_ids"] = ids
            if first:
                extra["prompt_token_ids"] = prompt_ids
        if req.logprobs and ids:
            extra["logprobs"] = _completion_logprobs(codec, ids, lps, outcome().top_for(ids), req.top_logprobs, offset)
        offset += len(text)
        if text or extra:
            yield chunk(text, **extra)
            first = False
    final = outcome()
    if final.kind == "abort":
        return  # the caller ends the stream with the dialect's error event
    pieces, turn = asm.finish(final)
    tail = "".join(p.text for p in pieces if isinstance(p, TextPiece))
    if on_turn is not None:
        await _maybe_await(on_turn(turn))
    last: dict[str, Any] = {"token_ids": []} if req.return_token_ids else {}
    yield chunk(tail, "length" if final.kind == "length" else "stop", stop_reason=final.stop_string, **last)
    if req.include_usage:
        usage = _usage(len(prompt_ids), len(final.output_ids), final.cached_tokens)
        yield Frame({**head, "choices": [], "usage": usage})
    yield DONE
