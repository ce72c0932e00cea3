"""``tool_choice`` and ``response_format`` made real: constrained decoding on the engine, or the dialect's 400.

A forced tool call (OpenAI ``required`` or a named function, Anthropic ``any`` or ``tool``) is generated as
SGLang generates it: under a ``json_schema`` constraint, a JSON array of ``{"name", "parameters"}`` objects
(SGLang's ``get_json_schema_constraint``), parsed back into tool calls. ``none`` keeps the tool-call tag from
being sampled. A JSON response format is the same constraint over the answer's text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ._errors import ApiError
from ._tooldefs import check_schema

__all__ = ["ToolChoice", "forced_calls_schema", "parse_forced_calls", "response_format_schema", "structured_sampling"]

_MAX_PARALLEL = 4  # calls in one forced turn when parallel calls are allowed (a bound keeps decoding finite)


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: str  # "auto" | "none" | "required" | "named"
    name: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "named")

    @classmethod
    def openai(cls, body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ToolChoice:
        raw = body.get("tool_choice")
        parallel = body.get("parallel_tool_calls", True)
        if not isinstance(parallel, bool):
            raise ApiError.invalid("'parallel_tool_calls' must be a boolean", param="parallel_tool_calls")
        if raw is None:
            return cls("auto", parallel=parallel)
        if raw in ("auto", "none", "required"):
            choice = cls(str(raw), parallel=parallel)
        elif isinstance(raw, dict) and raw.get("type") == "function":
            fn = raw.get("function")
            name = fn.get("name") if isinstance(fn, dict) else raw.get("name")  # Responses: {"type", "name"}
            if not isinstance(name, str):
                raise ApiError.invalid("'tool_choice.function.name' is required", param="tool_choice")
            choice = cls("named", name, parallel)
        else:
            raise ApiError.invalid(
                "'tool_choice' must be 'none', 'auto', 'required' or a function", param="tool_choice"
            )
        return choice.check(tools, "tool_choice")

    @classmethod
    def anthropic(cls, body: dict[str, Any], tools: list[dict[str, Any]] | None) -> ToolChoice:
        raw = body.get("tool_choice")
        if raw is None:
            return cls("auto")
        if not isinstance(raw, dict) or raw.get("type") not in ("auto", "any", "tool", "none"):
            raise ApiError.invalid("tool_choice.type: must be one of 'auto', 'any', 'tool', 'none'")
        parallel = not raw.get("disable_parallel_tool_use", False)
        kind = raw["type"]
        if kind == "tool":
            if not isinstance(raw.get("name"), str):
                raise ApiError.invalid("tool_choice.name: Field required")
            return cls("named", raw["name"], parallel).check(tools, "tool_choice")
        mode = {"auto": "auto", "any": "required", "none": "none"}[kind]
        return cls(mode, parallel=parallel).check(tools, "tool_choice")

    def check(self, tools: list[dict[str, Any]] | None, param: str) -> ToolChoice:
        if self.forced and not tools:
            raise ApiError.invalid(f"'{param}' forces a tool call but no tools were given", param=param)
        if self.mode == "named" and self.name not in {t["function"]["name"] for t in tools or []}:
            raise ApiError.invalid(f"'{param}' names {self.name!r}, which is not among the tools", param=param)
        return self


def _tool_schema(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool["function"]
    return {
        "properties": {
            "name": {"type": "string", "enum": [fn["name"]]},
            "parameters": fn.get("parameters") or {"type": "object", "properties": {}},
        },
        "required": ["name", "parameters"],
    }


def forced_calls_schema(tools: list[dict[str, Any]], choice: ToolChoice) -> dict[str, Any]:
    """SGLang's constraint for a forced call: an array of one (or, in parallel, a few) ``{name, parameters}``."""
    chosen = [t for t in tools if choice.mode != "named" or t["function"]["name"] == choice.name]
    items = _tool_schema(chosen[0]) if len(chosen) == 1 else {"anyOf": [_tool_schema(t) for t in chosen]}
    return {"type": "array", "minItems": 1, "maxItems": _MAX_PARALLEL if choice.parallel else 1, "items": items}


def parse_forced_calls(text: str) -> list[tuple[str, str]] | None:
    """``(name, arguments JSON)`` of each call in a forced turn's text, or None if it is not such an array."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, list) or not value:
        return None
    out = []
    for call in value:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "parameters" not in call:
            return None
        out.append((call["name"], json.dumps(call["parameters"], separators=(",", ":"), ensure_ascii=False)))
    return out


def response_format_schema(raw: object, param: str = "response_format") -> dict[str, Any] | None:
    """The JSON Schema an OpenAI ``response_format`` (Chat) or ``text.format`` (Responses) asks for; None: text."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ApiError.invalid(f"'{param}' must be an object", param=param)
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        # Chat nests it under "json_schema"; the Responses API's text.format carries it inline.
        spec = raw.get("json_schema", raw)
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ApiError.invalid(f"'{param}.json_schema.schema' is required", param=f"{param}.json_schema")
        return check_schema(spec["schema"], f"{param}.json_schema.schema", require_object=False)
    raise ApiError.invalid(f"'{param}.type' must be 'text', 'json_object' or 'json_schema'", param=f"{param}.type")


def structured_sampling(
    sp: dict[str, Any],
    tools: list[dict[str, Any]] | None,
    choice: ToolChoice,
    json_schema: dict[str, Any] | None,
    tool_start: int | None,
) -> None:
    """Add to SGLang ``sampling_params`` what honours the call's tool choice and response format."""
    if choice.forced and json_schema is not None:
        raise ApiError.invalid("a forced tool call and a JSON response format cannot be combined", param="tool_choice")
    if choice.forced:
        sp["json_schema"] = json.dumps(forced_calls_schema(tools or [], choice))
    elif json_schema is not None:
        sp["json_schema"] = json.dumps(json_schema)
    if choice.mode == "none" and tools and tool_start is not None:
        # The tool-call tag is never sampled (a bias far below any logit: probability 0 in float32).
        sp["logit_bias"] = {**sp.get("logit_bias", {}), str(tool_start): -1e9}
