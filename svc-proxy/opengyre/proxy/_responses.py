"""The OpenAI Responses dialect (``POST /v1/responses``): input items, function tools, ``previous_response_id``,
the response object and its event stream, as the official ``openai`` SDK parses them.

Input items become the chat-template messages the other dialects use (``function_call`` items join the
assistant turn before them, ``function_call_output`` items are tool turns), so TITO extends a conversation
however the harness sends it. ``previous_response_id`` continues from the recorded call it names: the
response id is ``resp_<call_id>``, resolved in the execution's own trajectory (and after a restart, in what
the store restores), so no response is kept twice and none is reachable from another execution.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from ._assembly import Outcome, StreamAssembler, TextPiece, ToolPiece, Turn
from ._chat import ChatCodec
from ._errors import ApiError
from ._openai import chat_logprobs_content, error_body
from ._request import GenRequest, check_number
from ._sse import sse
from ._structured import ToolChoice, response_format_schema
from ._temperature import DEFAULT_TEMPERATURE
from ._tito import ExecutionTrajectory
from ._tooldefs import OPENAI_NAME, check_schema, check_tool_name

__all__ = ["parse_responses", "resolve_previous", "response_body", "response_stream", "stream_error"]

_LOGPROBS = "message.output_text.logprobs"
_PART_TYPES = {"input_text", "output_text", "text"}


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError.invalid(f"'{where}' must be a string or a list of content parts", param=where)
    out = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in _PART_TYPES or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ApiError.invalid(
                f"'{where}[{j}]': content type {kind!r} is not supported by this model (text only)",
                param=f"{where}[{j}]",
            )
        out.append(part["text"])
    return "".join(out)


def _input_messages(raw: object) -> list[dict[str, Any]]:
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list):
        raise ApiError.invalid("'input' must be a string or a list of items", param="input")
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise ApiError.invalid(f"'{where}' must be an object", param=where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ApiError.invalid(f"'{where}.role' must be user, system, developer or assistant", param=where)
            out.append(
                {
                    "role": "system" if role == "developer" else role,
                    "content": _text(item.get("content"), f"{where}.content"),
                }
            )
        elif kind == "function_call":
            name, call_id, args = item.get("name"), item.get("call_id"), item.get("arguments")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
                raise ApiError.invalid(f"'{where}': a function_call needs name, call_id and arguments", param=where)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":  # the calls of one turn follow its message item
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ApiError.invalid(f"'{where}.call_id' is required", param=f"{where}.call_id")
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            )
        elif kind == "reasoning":
            continue  # this model has no reasoning format: there is nothing of it to render
        else:
            raise ApiError.invalid(f"'{where}': item type {kind!r} is not supported", param=f"{where}.type")
    return out


def _tools(raw: object) -> list[dict[str, Any]] | None:
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ApiError.invalid("'tools' must be a list", param="tools")
    out = []
    names: dict[str, str] = {}
    for i, t in enumerate(raw):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise ApiError.invalid(
                f"tools[{i}]: tool type {kind!r} is not supported (function tools only)", param=f"tools[{i}]"
            )
        fn: dict[str, Any] = {"name": check_tool_name(t.get("name"), OPENAI_NAME, f"tools[{i}].name", names)}
        if t.get("description"):
            fn["description"] = t["description"]
        if t.get("parameters") is not None:
            fn["parameters"] = check_schema(t["parameters"], f"tools[{i}].parameters", require_object=False)
        out.append({"type": "function", "function": fn})
    return out or None


def parse_responses(raw: object) -> GenRequest:
    if not isinstance(raw, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    body = raw
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid("you must provide a model parameter", param="model")
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise ApiError.invalid("'stream' must be a boolean", param="stream")
    req = GenRequest(dialect="openai-responses", model=model, stream=bool(stream))
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError.invalid("'instructions' must be a string", param="instructions")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise ApiError.invalid("'previous_response_id' must be a string", param="previous_response_id")
    if body.get("input") is None and previous is None:
        raise ApiError.invalid("'input' is required", param="input")
    new = _input_messages(body.get("input") if body.get("input") is not None else [])
    req.messages = ([{"role": "system", "content": instructions}] if instructions else []) + new
    if not req.messages and previous is None:
        raise ApiError.invalid("'input' must hold at least one item", param="input")
    req.tools = _tools(body.get("tools"))
    req.tool_choice = ToolChoice.openai(body, req.tools)
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise ApiError.invalid("'text' must be an object", param="text")
    req.json_schema = response_format_schema((text or {}).get("format"), "text.format")
    mt = body.get("max_output_tokens")
    if mt is not None and (isinstance(mt, bool) or not isinstance(mt, int) or mt < 1):
        raise ApiError.invalid("'max_output_tokens' must be a positive integer", param="max_output_tokens")
    req.max_tokens = mt
    for key, lo, hi in (("temperature", 0.0, 2.0), ("top_p", 0.0, 1.0)):
        v = check_number(body, key, lo, hi)
        if v is not None:
            req.sampling[key] = max(v, 1e-9) if key == "top_p" else v
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and reasoning.get("effort") not in (None, "none"):
        raise ApiError.invalid(
            f"reasoning: model {model!r} does not support reasoning effort", param="reasoning.effort"
        )
    if body.get("background"):
        raise ApiError.invalid("background responses are not supported", param="background")
    if body.get("truncation") not in (None, "disabled"):
        raise ApiError.invalid("only truncation 'disabled' is supported", param="truncation")
    include = body.get("include") or []
    if not isinstance(include, list):
        raise ApiError.invalid("'include' must be a list", param="include")
    unknown = [x for x in include if x != _LOGPROBS]
    if unknown:
        raise ApiError.invalid(f"include {unknown[0]!r} is not supported", param="include")
    tl = body.get("top_logprobs")
    if tl is not None and (isinstance(tl, bool) or not isinstance(tl, int) or not 0 <= tl <= 20):
        raise ApiError.invalid("'top_logprobs' must be an integer in [0, 20]", param="top_logprobs")
    req.logprobs = _LOGPROBS in include
    req.top_logprobs = tl or 0
    req.echo_fields = {
        "instructions": instructions,
        "previous_response_id": previous,
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "text": text or {"format": {"type": "text"}},
        "store": body.get("store", True),
        "metadata": body.get("metadata") or {},
        "user": body.get("user"),
        "top_logprobs": req.top_logprobs,
    }
    return req


def resolve_previous(req: GenRequest, traj: ExecutionTrajectory) -> None:
    """Prefix the conversation of the response ``previous_response_id`` names (its instructions are replaced
    by this request's when it gives some)."""
    previous = req.echo_fields.get("previous_response_id")
    if previous is None:
        return
    node = traj.nodes.get(str(previous).removeprefix("resp_"))
    if node is None:
        raise ApiError.invalid(
            f"Previous response with id '{previous}' not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    before = list(node.conv_after)
    new = list(req.messages or [])
    if req.echo_fields.get("instructions") and before and before[0].get("role") == "system":
        before = before[1:]
        req.messages = [new[0], *before, *new[1:]]
    else:
        req.messages = before + new


# --- the response -----------------------------------------------------------------------------------------


def _usage(prompt_tokens: int, output_tokens: int, cached: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


def _shell(req: GenRequest, rid: str, created: float, status: str) -> dict[str, Any]:
    e = req.echo_fields
    return {
        "id": f"resp_{rid}",
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": e.get("instructions"),
        "max_output_tokens": req.max_tokens,
        "model": req.model,
        "output": [],
        "parallel_tool_calls": req.tool_choice.parallel,
        "previous_response_id": e.get("previous_response_id"),
        "reasoning": {"effort": None, "summary": None},
        "store": e.get("store", True),
        "temperature": req.sampling.get("temperature", DEFAULT_TEMPERATURE),
        "text": e.get("text", {"format": {"type": "text"}}),
        "tool_choice": e.get("tool_choice", "auto"),
        "tools": e.get("tools", []),
        "top_logprobs": e.get("top_logprobs", 0),
        "top_p": req.sampling.get("top_p", 1.0),
        "truncation": "disabled",
        "usage": None,
        "metadata": e.get("metadata", {}),
        "user": e.get("user"),
    }


def _message_item(rid: str, text: str, status: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}
    return {"type": "message", "id": f"msg_{rid}", "status": status, "role": "assistant", "content": [part]}


def _call_item(call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{call_id.removeprefix('call_')}",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _finished(
    req: GenRequest,
    rid: str,
    created: float,
    outcome: Outcome,
    turn: Turn,
    prompt_ids: list[int],
    output: list[dict[str, Any]],
) -> dict[str, Any]:
    status = "incomplete" if turn.finish == "length" else "completed"
    resp = _shell(req, rid, created, status)
    if status == "incomplete":
        resp["incomplete_details"] = {"reason": "max_output_tokens"}
    resp["output"] = output
    resp["usage"] = _usage(len(prompt_ids), len(outcome.output_ids), outcome.cached_tokens)
    return resp


def response_body(
    req: GenRequest, codec: ChatCodec, outcome: Outcome, turn: Turn, prompt_ids: list[int], rid: str
) -> dict[str, Any]:
    status = "incomplete" if turn.finish == "length" else "completed"
    output: list[dict[str, Any]] = []
    if turn.content:
        lps = (
            chat_logprobs_content(
                codec,
                outcome.output_ids,
                outcome.output_logprobs,
                outcome.top_for(outcome.output_ids),
                req.top_logprobs,
            )
            if req.logprobs
            else []
        )
        output.append(_message_item(rid, turn.content, status, lps))
    output += [_call_item(t.id, t.name, t.arguments, "completed") for t in turn.tool_calls]
    return _finished(req, rid, time.time(), outcome, turn, prompt_ids, output)


def stream_error(err: ApiError) -> bytes:
    """The event that ends a stream whose call failed after the 200 went out (no response.completed); its
    ``code`` is the one a non-streamed call's error carries, else the error's type."""
    code = err.code or error_body(err)["error"]["type"]
    return _event({"type": "error", "code": code, "message": err.message, "param": err.param, "sequence_number": -1})


def _event(obj: dict[str, Any]) -> bytes:
    return sse(obj, str(obj["type"]))


async def response_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: AsyncIterator[tuple[list[int], list[float]]],
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[bytes]:
    """response.created, in_progress, then per output item: output_item.added, (content_part.added, output_text
    deltas, output_text.done, content_part.done | function_call_arguments delta and done), output_item.done;
    then response.completed (or response.incomplete at the length limit) with the whole response."""
    created = time.time()
    seq = 0
    output: list[dict[str, Any]] = []

    def ev(obj: dict[str, Any]) -> bytes:
        nonlocal seq
        obj["sequence_number"] = seq
        seq += 1
        return _event(obj)

    yield ev({"type": "response.created", "response": _shell(req, rid, created, "in_progress")})
    yield ev({"type": "response.in_progress", "response": _shell(req, rid, created, "in_progress")})
    asm = StreamAssembler(codec, req.stop, "call_", forced_calls=req.tool_choice.forced)
    msg_index: int | None = None
    text = ""
    lps: list[dict[str, Any]] = []
    item_id = f"msg_{rid}"

    def close_message(status: str) -> list[bytes]:
        nonlocal msg_index
        if msg_index is None:
            return []
        index, msg_index = msg_index, None
        part = {"type": "output_text", "text": text, "annotations": [], "logprobs": lps}
        item = _message_item(rid, text, status, lps)
        output[index] = item
        common = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            ev({"type": "response.output_text.done", **common, "text": text, "logprobs": lps}),
            ev({"type": "response.content_part.done", **common, "part": part}),
            ev({"type": "response.output_item.done", "output_index": index, "item": item}),
        ]

    def emit(pieces: list[TextPiece | ToolPiece], new_lps: list[dict[str, Any]]) -> list[bytes]:
        nonlocal msg_index, text
        out: list[bytes] = []
        for p in pieces:
            if isinstance(p, TextPiece):
                if msg_index is None:
                    msg_index = len(output)
                    output.append(_message_item(rid, "", "in_progress", []))
                    item = {**output[msg_index], "content": []}
                    out.append(ev({"type": "response.output_item.added", "output_index": msg_index, "item": item}))
                    part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                    common = {"item_id": item_id, "output_index": msg_index, "content_index": 0}
                    out.append(ev({"type": "response.content_part.added", **common, "part": part}))
                text += p.text
                common = {"item_id": item_id, "output_index": msg_index, "content_index": 0}
                out.append(ev({"type": "response.output_text.delta", **common, "delta": p.text, "logprobs": new_lps}))
                new_lps = []
                continue
            out += close_message("completed")
            c = p.call
            index = len(output)
            added = _call_item(c.id, c.name, "", "in_progress")
            output.append(_call_item(c.id, c.name, c.arguments, "completed"))
            fc = {"item_id": added["id"], "output_index": index}
            out.append(ev({"type": "response.output_item.added", "output_index": index, "item": added}))
            out.append(ev({"type": "response.function_call_arguments.delta", **fc, "delta": c.arguments}))
            out.append(ev({"type": "response.function_call_arguments.done", **fc, "arguments": c.arguments}))
            out.append(ev({"type": "response.output_item.done", "output_index": index, "item": output[index]}))
        return out

    async for ids, id_lps in source:
        new_lps = (
            chat_logprobs_content(codec, ids, id_lps, outcome().top_for(ids), req.top_logprobs)
            if req.logprobs and ids
            else []
        )
        lps += new_lps
        for b in emit(asm.push(ids), new_lps):
            yield b
    final = outcome()
    if final.kind == "abort":
        return  # the caller ends the stream with the dialect's error event
    pieces, turn = asm.finish(final)
    for b in emit(pieces, []):
        yield b
    status = "incomplete" if turn.finish == "length" else "completed"
    for b in close_message(status):
        yield b
    if on_turn is not None:
        r = on_turn(turn)
        if hasattr(r, "__await__"):
            await r
    done = _finished(req, rid, created, final, turn, prompt_ids, output)
    yield ev({"type": f"response.{status}", "response": done})
