"""Generated token ids -> an assistant turn (text and tool calls), all at once or as a stream of pieces.

Dialects (OpenAI, Anthropic) only format what this produces, so a streamed answer and a non-streamed one
carry the same text and the same tool calls, and the proxy records the tool calls exactly as emitted.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from opengyre.chat import ChatCodec, IncrementalDecoder, parse_tool_call

from ._structured import parse_forced_calls

__all__ = [
    "Outcome",
    "StreamAssembler",
    "TextPiece",
    "ToolCallOut",
    "ToolPiece",
    "Turn",
    "arguments_object",
    "assemble",
    "new_tool_id",
]


TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"


def _partial_suffix(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def new_tool_id(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(12)}"


def arguments_object(arguments: str) -> dict[str, Any]:
    """Raw tool-call arguments as the JSON object a format wants (Anthropic ``input``, ATIF ``arguments``);
    text that is not one is wrapped, never dropped."""
    try:
        v = json.loads(arguments)
    except ValueError:
        return {"_raw": arguments}
    return v if isinstance(v, dict) else {"_value": v}


@dataclass(frozen=True, slots=True)
class ToolCallOut:
    id: str
    name: str
    arguments: str  # raw JSON text as the model emitted it


@dataclass(slots=True)
class Outcome:
    """How a generation ended, in SGLang's terms (``finish`` is its finish_reason object)."""

    output_ids: list[int] = field(default_factory=list)
    output_logprobs: list[float] = field(default_factory=list)
    # Per output token, the most likely alternatives as (token id, logprob), when the call asked for them.
    output_top: list[list[tuple[int, float]]] = field(default_factory=list)
    finish: dict[str, Any] | None = None
    weight_version: str = "default"
    weight_spans: list[tuple[str, int, int]] = field(default_factory=list)  # per-token versions over outputs
    cached_tokens: int = 0
    prompt_tokens: int = 0

    def top_for(self, ids: Sequence[int]) -> list[list[tuple[int, float]]]:
        """The alternatives of ``ids``, the last tokens added to ``output_ids`` ([] where none came)."""
        end = len(self.output_ids)
        start = end - len(ids)
        return [self.output_top[i] if i < len(self.output_top) else [] for i in range(start, end)]

    @property
    def kind(self) -> str:
        return str((self.finish or {}).get("type", "abort"))

    @property
    def stop_string(self) -> str | None:
        m = (self.finish or {}).get("matched")
        return m if self.kind == "stop" and isinstance(m, str) else None


@dataclass(frozen=True, slots=True)
class Turn:
    content: str
    tool_calls: tuple[ToolCallOut, ...]
    finish: str  # "stop" | "length" | "tool_calls" | "abort"
    stop_string: str | None = None

    def message(self) -> dict[str, Any]:
        """The turn as an (OpenAI-shaped) assistant message, the form TITO compares the harness's history to."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {"id": t.id, "type": "function", "function": {"name": t.name, "arguments": t.arguments}}
                for t in self.tool_calls
            ]
        return msg


def _finish(outcome: Outcome, has_tools: bool) -> str:
    if outcome.kind == "length":
        return "length"
    if outcome.kind == "abort":
        return "abort"
    return "tool_calls" if has_tools else "stop"


def assemble(
    codec: ChatCodec,
    outcome: Outcome,
    tool_prefix: str = "call_",
    *,
    parse_tools: bool = True,
    forced_calls: bool = False,
) -> Turn:
    """The whole turn at once; the same code path as streaming, so both give identical text and calls."""
    stop = [outcome.stop_string] if outcome.stop_string else []
    asm = StreamAssembler(codec, stop, tool_prefix, parse_tools=parse_tools, forced_calls=forced_calls)
    asm.push(outcome.output_ids)
    return asm.finish(outcome)[1]


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ToolPiece:
    index: int
    call: ToolCallOut


class StreamAssembler:
    """Feed generated ids as they come; get text pieces and whole tool calls, in order.

    Text is held back by the longest stop string (plus slack for multi-character tokens) so a stop string
    that completes later is never sent; a tool call is emitted once its closing tag arrives. A forced turn
    (``forced_calls``: generated under ``_structured``'s constraint) is one JSON array of calls, parsed at
    the end; if it is not one (cut by the length limit), its text is the content.
    """

    def __init__(
        self,
        codec: ChatCodec,
        stop: Sequence[str] = (),
        tool_prefix: str = "call_",
        *,
        parse_tools: bool = True,
        forced_calls: bool = False,
    ) -> None:
        self.codec = codec
        self.parse_tools = parse_tools
        self.forced_calls = forced_calls
        self.tool_prefix = tool_prefix
        self._text = IncrementalDecoder(codec)
        self._hold = (max(len(s) for s in stop) + 16) if stop else 0
        self._pending = ""
        self._in_tool: list[int] | None = None
        self._scan = ""  # text-tag mode: decoded text not yet classified (a tag may be completing)
        self._in_tool_text = False
        self.tool_calls: list[ToolCallOut] = []
        self.content = ""  # all text emitted so far
        self.ids: list[int] = []

    def _emit_text(self, text: str, out: list[TextPiece | ToolPiece]) -> None:
        if not text:
            return
        if self._hold:
            self._pending += text
            if len(self._pending) <= self._hold:
                return
            text, self._pending = self._pending[: -self._hold], self._pending[-self._hold :]
        self.content += text
        out.append(TextPiece(text))

    def push(self, ids: Sequence[int]) -> list[TextPiece | ToolPiece]:
        out: list[TextPiece | ToolPiece] = []
        if self.forced_calls:  # nothing is shown before the whole array is there
            self.ids.extend(ids)
            return out
        if self.parse_tools and self.codec.tool_start is None:
            # The tags are plain text in this vocabulary (a pretrained BPE without tool tokens): find them in text.
            self.ids.extend(ids)
            self._scan_text(self._text.push(ids), out)
            return out
        start = self.codec.tool_start if self.parse_tools else None
        end = self.codec.tool_end
        run: list[int] = []  # consecutive text ids, decoded together
        for t in ids:
            self.ids.append(t)
            if self._in_tool is not None:
                if t == end:
                    self._close_tool(out)
                else:
                    self._in_tool.append(t)
                continue
            if start is not None and t == start:
                self._emit_text(self._text.push(run) + self._text.flush(), out)
                run = []
                self._in_tool = []
                continue
            run.append(t)
        if run:
            self._emit_text(self._text.push(run), out)
        return out

    def _scan_text(self, text: str, out: list[TextPiece | ToolPiece]) -> None:
        """Text-tag mode: ``<tool_call>`` body ``</tool_call>`` found in the decoded text, held back while a tag
        may still be completing, so a streamed turn and a whole one split text and calls the same way."""
        buf = self._scan + text
        while True:
            if self._in_tool_text:
                at = buf.find(TOOL_CLOSE)
                if at == -1:
                    break
                body, buf = buf[:at], buf[at + len(TOOL_CLOSE) :]
                self._in_tool_text = False
                self._close_tool_text(body, out)
                continue
            at = buf.find(TOOL_OPEN)
            if at == -1:
                keep = _partial_suffix(buf, TOOL_OPEN)
                self._emit_text(buf[: len(buf) - keep], out)
                buf = buf[len(buf) - keep :]
                break
            self._emit_text(buf[:at], out)
            buf = buf[at + len(TOOL_OPEN) :]
            self._in_tool_text = True
        self._scan = buf

    def _close_tool_text(self, body: str, out: list[TextPiece | ToolPiece]) -> None:
        parsed = parse_tool_call(body.strip())
        if parsed is None:  # malformed: the model's text, tags included, exactly as it wrote it
            self._emit_text(TOOL_OPEN + body + TOOL_CLOSE, out)
            return
        call = ToolCallOut(new_tool_id(self.tool_prefix), parsed[0], parsed[1])
        self.tool_calls.append(call)
        out.append(ToolPiece(len(self.tool_calls) - 1, call))

    def _close_tool(self, out: list[TextPiece | ToolPiece]) -> None:
        body_ids = self._in_tool or []
        self._in_tool = None
        body = self.codec.decode(body_ids, skip_special=False)
        parsed = parse_tool_call(body.strip())
        if parsed is None:
            # Not a tool call after all: its text joins the content, as the non-streamed parse does.
            self._emit_text(self.codec.decode(body_ids), out)
            return
        call = ToolCallOut(new_tool_id(self.tool_prefix), parsed[0], parsed[1])
        self.tool_calls.append(call)
        out.append(ToolPiece(len(self.tool_calls) - 1, call))

    def _finish_forced(self, outcome: Outcome) -> tuple[list[TextPiece | ToolPiece], Turn]:
        out: list[TextPiece | ToolPiece] = []
        text = self.codec.decode(self.ids)
        calls = parse_forced_calls(text)
        if calls is None:
            self._hold = 0
            self._emit_text(text, out)
        else:
            for name, arguments in calls:
                self.tool_calls.append(ToolCallOut(new_tool_id(self.tool_prefix), name, arguments))
                out.append(ToolPiece(len(self.tool_calls) - 1, self.tool_calls[-1]))
        calls_out = tuple(self.tool_calls)
        turn = Turn(self.content, calls_out, _finish(outcome, bool(calls_out)), outcome.stop_string)
        return out, turn

    def finish(self, outcome: Outcome) -> tuple[list[TextPiece | ToolPiece], Turn]:
        if self.forced_calls:
            return self._finish_forced(outcome)
        out: list[TextPiece | ToolPiece] = []
        if self._in_tool is not None:  # an unterminated tool call is text
            body = self._in_tool
            self._in_tool = None
            self._emit_text(self.codec.decode(body), out)
        rest = self._text.flush()
        if self.parse_tools and self.codec.tool_start is None:
            self._scan_text(rest, out)
            # an unterminated call or a partial tag is text
            rest = (TOOL_OPEN if self._in_tool_text else "") + self._scan
            self._scan, self._in_tool_text = "", False
        tail = self._pending + rest
        self._pending = ""
        hold, self._hold = self._hold, 0
        stop = outcome.stop_string
        if stop is not None:
            full = self.content + tail
            if stop in full:
                tail = full[: full.index(stop)][len(self.content) :]
        self._emit_text(tail, out)
        self._hold = hold
        calls = tuple(self.tool_calls)
        turn = Turn(
            content=self.content,
            tool_calls=calls,
            finish=_finish(outcome, bool(calls)),
            stop_string=stop,
        )
        return out, turn
