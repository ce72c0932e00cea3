"""Server-sent-event framing, the one place every streamed face writes it (the dialects, the merge of
``n`` streams, the CPU engine): ``data: <json>`` and an optional ``event:`` line, a blank line after."""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["DONE", "sse"]

_enc = msgspec.json.Encoder()

DONE = b"data: [DONE]\n\n"  # OpenAI's (and SGLang's) end of stream


def sse(obj: Any, event: str | None = None) -> bytes:
    """One event: ``obj`` as JSON, named ``event`` when the protocol names its events (Anthropic, Responses)."""
    head = b"event: " + event.encode() + b"\n" if event is not None else b""
    return head + b"data: " + _enc.encode(obj) + b"\n\n"
