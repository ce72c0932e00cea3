"""The OpenAI Responses dialect (``POST /v1/responses``): input items, function tools, ``previous_response_id``,
the response object and its event stream, as the official ``openai`` SDK parses them.

Input items become the chat-template messages the other dialects use (``function_call`` items join the
assistant turn before them, ``function_call_output`` items are tool turns), so TITO extends a conversation
however the harness sends it. ``previous_response_id`` continues from the recorded call it names: the
response id is ``resp_<call_id>``, resolved in the execution's own trajectory (and after a restart, in what
the store restores), so no response is kept twice and none is reachable from another execution.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from opengyre.chat import ChatCodec
from opengyre.tito import ExecutionTrajectory
from opengyre.wire import (
    OPENAI_NAME,
    ApiError,
    Frame,
    GenRequest,
    Outcome,
    StreamAssembler,
    TextPiece,
    ToolChoice,
    ToolPiece,
    Turn,
    check_number,
    check_schema,
    check_tool_name,
    response_format_schema,
)
from opengyre.wire.openai import chat_logprobs_content, error_body

from .._temperature import DEFAULT_TEMPERATURE

__all__ = ["parse_responses", "resolve_previous", "response_body", "response_stream", "stream_error"]

_LOGPROBS = "message.output_text.logprobs"
_PART_TYPES = {"input_text", "output_text", "text"}


def custom_arguments(text: str) -> str:
    """A freeform (``custom``) tool's input as the arguments the chat template renders: the one string
    parameter ``input`` the tool is offered with."""
    return json.dumps({"input": text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """The string a freeform tool call carries, from the model's arguments (kept whole when not the object)."""
    try:
        obj = json.loads(arguments)
    except ValueError:
        return arguments
    return obj["input"] if isinstance(obj, dict) and isinstance(obj.get("input"), str) else arguments


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
                f"'{where}[{j}]': content type {kind!r} is not supported: the served model reads text only",
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
        elif kind in ("function_call", "custom_tool_call"):
            # A namespaced function is rendered under its own name (the namespaces are flattened, see _tools).
            name, call_id = item.get("name"), item.get("call_id")
            args = item.get("arguments") if kind == "function_call" else item.get("input")
            if not isinstance(name, str) or not isinstance(call_id, str) or not isinstance(args, str):
                need = "arguments" if kind == "function_call" else "input"
                raise ApiError.invalid(f"'{where}': a {kind} needs name, call_id and {need}", param=where)
            if kind == "custom_tool_call":
                args = custom_arguments(args)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            if out and out[-1]["role"] == "assistant":  # the calls of one turn follow its message item
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ApiError.invalid(f"'{where}.call_id' is required", param=f"{where}.call_id")
            out.append(
                {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            )
        elif kind == "reasoning":
            # This model has no reasoning format (and writes no reasoning items, so none of its own come back).
            continue
        else:
            raise ApiError.invalid(f"'{where}': item type {kind!r} is not supported", param=f"{where}.type")
    return out


_HOSTED = {
    "web_search", "web_search_preview", "web_search_2025_08_26", "web_search_preview_2025_03_11", "file_search",
    "code_interpreter", "computer_use_preview", "computer", "image_generation", "mcp", "local_shell", "shell",
    "apply_patch", "tool_search",
}  # fmt: skip


def _function(t: dict[str, Any], where: str, names: dict[str, str], description: str | None) -> dict[str, Any]:
    fn: dict[str, Any] = {"name": check_tool_name(t.get("name"), OPENAI_NAME, f"{where}.name", names)}
    desc = "\n\n".join(d for d in (description, t.get("description")) if d)
    if desc:
        fn["description"] = desc
    if t.get("type") == "custom":
        fmt = t.get("format") or {"type": "text"}
        if not isinstance(fmt, dict) or fmt.get("type") not in ("text", "grammar"):
            raise ApiError.invalid(f"'{where}.format.type' must be 'text' or 'grammar'", param=f"{where}.format")
        about = "the tool's whole input, as free text"
        if fmt["type"] == "grammar":
            if not isinstance(fmt.get("definition"), str) or fmt.get("syntax") not in ("lark", "regex"):
                raise ApiError.invalid(f"'{where}.format' needs a lark or regex definition", param=f"{where}.format")
            about += f" in this {fmt['syntax']} grammar:\n{fmt['definition']}"
        fn["parameters"] = {
            "type": "object",
            "properties": {"input": {"type": "string", "description": about}},
            "required": ["input"],
        }
    elif t.get("parameters") is not None:
        fn["parameters"] = check_schema(t["parameters"], f"{where}.parameters", require_object=False)
    return {"type": "function", "function": fn}


def _tools(raw: object, kinds: dict[str, str]) -> list[dict[str, Any]] | None:
    """Function tools; ``custom`` (freeform) tools as a function of one string ``input``; a ``namespace``'s
    tools flattened under their own names (the namespace's description before each one's), remembered in
    ``kinds`` so the answer's call names its namespace. Hosted tools (``web_search``, ``file_search``, ...) are
    refused: the vendor runs them, and this server has nothing that could."""
    if raw is None:
        return None
    if not isinstance(raw, list):
        raise ApiError.invalid("'tools' must be a list", param="tools")
    out = []
    names: dict[str, str] = {}
    for i, t in enumerate(raw):
        kind = t.get("type") if isinstance(t, dict) else None
        where = f"tools[{i}]"
        if not isinstance(t, dict) or kind not in ("function", "custom", "namespace"):
            hint = ""
            if isinstance(kind, str) and kind.startswith("web_search"):
                hint = ' (Codex: set web_search = "disabled" in its config)'
            what = "a hosted tool this server cannot run" if kind in _HOSTED else "not supported"
            raise ApiError.invalid(f"{where}: tool type {kind!r} is {what}{hint}", param=where)
        if t.get("defer_loading"):
            raise ApiError.invalid(f"'{where}.defer_loading': tool search is not supported", param=where)
        if kind != "namespace":
            out.append(_function(t, where, names, None))
            if kind == "custom":
                kinds[t["name"]] = "custom"
            continue
        ns = t.get("name")
        inner = t.get("tools")
        if not isinstance(ns, str) or not isinstance(inner, list):
            raise ApiError.invalid(f"'{where}': a namespace needs a name and tools", param=where)
        for j, sub in enumerate(inner):
            sw = f"{where}.tools[{j}]"
            if not isinstance(sub, dict) or sub.get("type") not in ("function", "custom"):
                raise ApiError.invalid(f"'{sw}': a namespace holds function or custom tools", param=sw)
            if sub.get("defer_loading"):
                raise ApiError.invalid(f"'{sw}.defer_loading': tool search is not supported", param=sw)
            out.append(_function(sub, sw, names, t.get("description")))
            kinds[sub["name"]] = f"namespace:{ns}" + (":custom" if sub.get("type") == "custom" else "")
    return out or None


# Every top-level field of ResponseCreateParams (openai 3.x); anything else is the API's "Unknown parameter".
_FIELDS = {
    "model", "input", "instructions", "previous_response_id", "tools", "tool_choice", "parallel_tool_calls", "text",
    "max_output_tokens", "temperature", "top_p", "reasoning", "background", "truncation", "include", "top_logprobs",
    "stream", "stream_options", "store", "metadata", "user", "prompt_cache_key", "prompt_cache_retention",
    "safety_identifier", "service_tier", "client_metadata", "max_tool_calls", "conversation", "prompt",
}  # fmt: skip
_EFFORTS = (None, "none", "minimal", "low", "medium", "high", "xhigh")
_INCLUDES = {_LOGPROBS, "reasoning.encrypted_content"}


def _options(body: dict[str, Any], req: GenRequest) -> None:
    """Fields accepted as the API accepts them that change nothing on this engine (``req.no_effect``)."""
    reasoning = body.get("reasoning")
    if reasoning is not None:
        if not isinstance(reasoning, dict) or set(reasoning) - {"effort", "summary", "generate_summary"}:
            raise ApiError.invalid("'reasoning' takes effort and summary", param="reasoning")
        if reasoning.get("effort") not in _EFFORTS:
            raise ApiError.invalid(f"'reasoning.effort' must be one of {_EFFORTS[1:]}", param="reasoning.effort")
        summary = reasoning.get("summary", reasoning.get("generate_summary"))
        if summary not in (None, "auto", "concise", "detailed"):
            raise ApiError.invalid("'reasoning.summary' must be auto, concise or detailed", param="reasoning.summary")
        req.no_effect["reasoning"] = "the served model has no reasoning: no effort to set, no summary to write"
    for key in ("conversation", "prompt", "max_tool_calls"):
        if body.get(key) is not None:
            raise ApiError.invalid(f"'{key}' is not supported", param=key)
    text = body.get("text") or {}
    if text.get("verbosity") not in (None, "low", "medium", "high"):
        raise ApiError.invalid("'text.verbosity' must be low, medium or high", param="text.verbosity")
    for key, why in (
        ("prompt_cache_key", "the engine's prefix cache is automatic"),
        ("prompt_cache_retention", "the engine's prefix cache is automatic"),
        ("client_metadata", "the caller's labels"),
        ("safety_identifier", "the caller's label"),
        ("service_tier", "one capacity pool"),
        ("stream_options", "no obfuscation padding is sent"),
    ):
        if body.get(key) is not None:
            req.no_effect[key] = why
    if text.get("verbosity") is not None:
        req.no_effect["text.verbosity"] = "the served model has no verbosity control"
    if body.get("store") is False:
        req.no_effect["store"] = "false: the call is recorded for training all the same (it is this server's job)"


def parse_responses(raw: object) -> GenRequest:
    if not isinstance(raw, dict):
        raise ApiError.invalid("the request body must be a JSON object")
    body = raw
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ApiError.invalid(f"Unknown parameter: '{unknown[0]}'.", param=unknown[0], code="unknown_parameter")
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
    req.tools = _tools(body.get("tools"), req.tool_kinds)
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
    _options(body, req)
    if body.get("background"):
        raise ApiError.invalid("background responses are not supported", param="background")
    if body.get("truncation") not in (None, "disabled"):
        raise ApiError.invalid("only truncation 'disabled' is supported", param="truncation")
    include = body.get("include") or []
    if not isinstance(include, list):
        raise ApiError.invalid("'include' must be a list", param="include")
    bad = [x for x in include if x not in _INCLUDES]
    if bad:
        raise ApiError.invalid(f"include {bad[0]!r} is not supported", param="include")
    if "reasoning.encrypted_content" in include:
        req.no_effect["include.reasoning.encrypted_content"] = "the model writes no reasoning items to include"
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
        "reasoning": {
            "effort": (body.get("reasoning") or {}).get("effort"),
            "summary": (body.get("reasoning") or {}).get("summary"),
        },
        "prompt_cache_key": body.get("prompt_cache_key"),
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
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": 0},
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
        "reasoning": e.get("reasoning", {"effort": None, "summary": None}),
        "prompt_cache_key": e.get("prompt_cache_key"),
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


def _call_item(req: GenRequest, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    """The output item of a tool call: a ``function_call`` (naming its namespace if it has one), or a
    ``custom_tool_call`` carrying the freeform tool's input string."""
    kind = req.tool_kinds.get(name, "")
    short = call_id.removeprefix("call_")
    if kind.endswith("custom"):
        item: dict[str, Any] = {
            "type": "custom_tool_call",
            "id": f"ctc_{short}",
            "call_id": call_id,
            "name": name,
            "input": custom_input(arguments),
        }
    else:
        item = {
            "type": "function_call",
            "id": f"fc_{short}",
            "call_id": call_id,
            "name": name,
            "arguments": arguments,
            "status": status,
        }
    if kind.startswith("namespace:"):
        item["namespace"] = kind.split(":")[1]
    return item


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
    output += [_call_item(req, t.id, t.name, t.arguments, "completed") for t in turn.tool_calls]
    return _finished(req, rid, time.time(), outcome, turn, prompt_ids, output)


def stream_error(err: ApiError) -> list[Frame]:
    """The event that ends a stream whose call failed after the 200 went out (no response.completed); its
    ``code`` is the one a non-streamed call's error carries, else the error's type."""
    code = err.code or error_body(err)["error"]["type"]
    return [_event({"type": "error", "code": code, "message": err.message, "param": err.param, "sequence_number": -1})]


def _event(obj: dict[str, Any]) -> Frame:
    return Frame(obj, str(obj["type"]))


async def response_stream(
    req: GenRequest,
    codec: ChatCodec,
    source: AsyncIterator[tuple[list[int], list[float]]],
    outcome: Callable[[], Outcome],
    prompt_ids: list[int],
    rid: str,
    on_turn: Callable[[Turn], Any] | None = None,
) -> AsyncIterator[Frame]:
    """response.created, in_progress, then per output item: output_item.added, (content_part.added, output_text
    deltas, output_text.done, content_part.done | function_call_arguments delta and done), output_item.done;
    then response.completed (or response.incomplete at the length limit) with the whole response."""
    created = time.time()
    seq = 0
    output: list[dict[str, Any]] = []

    def ev(obj: dict[str, Any]) -> Frame:
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

    def close_message(status: str) -> list[Frame]:
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

    def emit(pieces: list[TextPiece | ToolPiece], new_lps: list[dict[str, Any]]) -> list[Frame]:
        nonlocal msg_index, text
        out: list[Frame] = []
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
            done = _call_item(req, c.id, c.name, c.arguments, "completed")
            output.append(done)
            fc = {"item_id": done["id"], "output_index": index}
            if done["type"] == "custom_tool_call":
                added = {**done, "input": ""}
                out.append(ev({"type": "response.output_item.added", "output_index": index, "item": added}))
                out.append(ev({"type": "response.custom_tool_call_input.delta", **fc, "delta": done["input"]}))
                out.append(ev({"type": "response.custom_tool_call_input.done", **fc, "input": done["input"]}))
            else:
                added = _call_item(req, c.id, c.name, "", "in_progress")
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
