"""The harness dialects the gateway speaks, as a table: how each parses, answers, streams and fails.

The gateway's call path is one piece of code; what differs between OpenAI Chat Completions, legacy
Completions, the Responses API and Anthropic Messages is looked up here, so a new dialect is a new entry,
not a new branch.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from opengyre.chat import ChatCodec
from opengyre.tito import ExecutionTrajectory
from opengyre.wire import ApiError, Frame, GenRequest, Outcome, Turn
from opengyre.wire import anthropic as anthropic_api
from opengyre.wire import openai as openai_api

from . import _responses as responses_api

__all__ = ["ANTHROPIC", "CHAT", "COMPLETIONS", "DIALECTS", "RESPONSES", "Dialect", "StreamFn"]

TokenSource = AsyncIterator[tuple[list[int], list[float]]]
OnTurn = Callable[[Turn], Any]
StreamFn = Callable[
    [GenRequest, ChatCodec, TokenSource, Callable[[], Outcome], list[int], str, OnTurn], AsyncIterator[Frame]
]
RespondFn = Callable[[GenRequest, ChatCodec, Outcome, Turn, list[int], str], dict[str, Any]]


@dataclass(frozen=True)
class Dialect:
    name: str
    parse: Callable[[object], GenRequest]
    respond: RespondFn  # the non-streamed body
    stream: StreamFn  # the SSE body as frames; ends early (before its final frames) when the outcome is an abort
    error_body: Callable[[ApiError], dict[str, Any]]
    stream_error: Callable[[ApiError], list[Frame]]  # the closing error frames of a stream whose call failed
    # (prompt tokens, context length, max_tokens asked for or None) -> the 400 it answers
    context_error: Callable[[int, int, int | None], ApiError]
    overloaded_status: int = 503  # Anthropic says 529
    tool_prefix: str = "call_"
    parse_tools: bool = True  # legacy completions return raw text, tool-call tags included
    multi: bool = False  # answers n > 1 samples as choices (OpenAI Chat and Completions)
    # Completes the parsed request from the execution's state (the Responses API's previous_response_id).
    resolve: Callable[[GenRequest, ExecutionTrajectory], None] | None = None


CHAT = Dialect(
    name="openai-chat",
    parse=openai_api.parse_chat,
    respond=openai_api.chat_response,
    stream=openai_api.chat_stream,
    error_body=openai_api.error_body,
    stream_error=openai_api.stream_error,
    context_error=openai_api.context_error,
    multi=True,
)

COMPLETIONS = Dialect(
    name="openai-completions",
    parse=openai_api.parse_completion,
    respond=openai_api.completion_response,
    stream=openai_api.completion_stream,
    error_body=openai_api.error_body,
    stream_error=openai_api.stream_error,
    context_error=openai_api.context_error,
    parse_tools=False,
    multi=True,
)

ANTHROPIC = Dialect(
    name="anthropic",
    parse=anthropic_api.parse_messages,
    respond=anthropic_api.message_response,
    stream=anthropic_api.message_stream,
    error_body=anthropic_api.error_body,
    stream_error=anthropic_api.stream_error,
    context_error=anthropic_api.context_error,
    overloaded_status=529,
    tool_prefix="toolu_",
)

RESPONSES = Dialect(
    name="openai-responses",
    parse=responses_api.parse_responses,
    respond=responses_api.response_body,
    stream=responses_api.response_stream,
    error_body=openai_api.error_body,
    stream_error=responses_api.stream_error,
    context_error=openai_api.context_error,
    resolve=responses_api.resolve_previous,
)

DIALECTS = {d.name: d for d in (CHAT, COMPLETIONS, RESPONSES, ANTHROPIC)}
