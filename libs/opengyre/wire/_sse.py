"""Server-sent events: the dialects' streams yield ``Frame`` objects, and each is framed into bytes once, at the
edge (``framed``, or ``Frame.encode``): ``data: <json>`` and an optional ``event:`` line, a blank line after. So
what merges or inspects a stream (the ``n``-sample merge, the error check) reads objects, never re-parses bytes."""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = ["DONE", "Frame", "framed"]

_enc = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class Frame:
    """One event: ``data`` as JSON, named ``event`` when the protocol names its events (Anthropic, Responses);
    ``data=None`` is ``[DONE]``."""

    data: Any = None
    event: str | None = None

    def encode(self) -> bytes:
        if self.data is None:
            return b"data: [DONE]\n\n"  # OpenAI's (and SGLang's) end of stream
        head = b"event: " + self.event.encode() + b"\n" if self.event is not None else b""
        return head + b"data: " + _enc.encode(self.data) + b"\n\n"


DONE = Frame()


async def framed(frames: AsyncIterable[Frame]) -> AsyncIterator[bytes]:
    """The stream's bytes, one chunk per frame."""
    async for f in frames:
        yield f.encode()
