"""The dialect-neutral model request both harness dialects parse into, and its sampling parameters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ._errors import ApiError
from ._structured import ToolChoice

__all__ = ["GenRequest", "check_number", "content_text"]

Message = dict[str, Any]


@dataclass
class GenRequest:
    dialect: str  # "openai-chat" | "openai-completions" | "openai-responses" | "anthropic"
    model: str
    stream: bool
    messages: list[Message] | None = None  # chat: OpenAI-shaped messages for the chat template
    tools: list[dict[str, Any]] | None = None  # OpenAI function-tool form
    prompt_ids: list[int] | None = None  # completions given token ids
    prompt_text: str | None = None  # completions given text
    max_tokens: int | None = None
    max_tokens_explicit: bool = True  # False: the dialect's default (legacy completions' 16), not the caller's
    stop: list[str] = field(default_factory=list)
    sampling: dict[str, Any] = field(default_factory=dict)  # SGLang sampling_params, less max_new_tokens/stop
    include_usage: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    return_token_ids: bool = False
    echo: bool = False
    n: int = 1  # independent samples of the same prompt (OpenAI dialects), each recorded as its own call
    tool_choice: ToolChoice = field(default_factory=lambda: ToolChoice("auto"))
    json_schema: dict[str, Any] | None = None  # the answer's text must be JSON of this schema
    echo_fields: dict[str, Any] = field(default_factory=dict)  # what a dialect's response repeats of the request
    # Parameters accepted as the vendor accepts them that change nothing on this engine: ``{param: why}``,
    # recorded with the call (docs/proxy.md lists them).
    no_effect: dict[str, str] = field(default_factory=dict)
    # Tools that are not plain functions, by the name the model calls: "custom" (a freeform tool: its input is
    # one string) or "namespace:<ns>" (a function of a Responses namespace), so the answer names them as the
    # vendor does.
    tool_kinds: dict[str, str] = field(default_factory=dict)


def check_number(body: dict[str, Any], key: str, lo: float, hi: float | None = None) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ApiError.invalid(f"'{key}' must be a number", param=key)
    if v < lo or (hi is not None and v > hi):
        raise ApiError.invalid(f"'{key}' must be between {lo} and {hi}", param=key)
    return float(v)


def content_text(content: object, *, param: str) -> str:
    """Text of an OpenAI content field: a string, or a list of text parts (other part types are refused)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict):
                raise ApiError.invalid(f"'{param}' parts must be objects", param=param)
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError.invalid(
                    f"'{param}' part type {part.get('type')!r} is not supported by this model (text only)",
                    param=param,
                )
            out.append(part["text"])
        return "".join(out)
    raise ApiError.invalid(f"'{param}' must be a string or a list of content parts", param=param)
