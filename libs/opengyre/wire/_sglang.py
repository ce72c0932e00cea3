"""SGLang's native per-token logprob forms, read by the proxy's engine client and the CPU engine's OpenAI routes."""

from __future__ import annotations

import math

__all__ = ["finite_number", "top_alternatives"]


def finite_number(x: object) -> float | None:
    """``x`` as a float if it is a finite int or float (not a bool), else None."""
    if isinstance(x, bool) or not isinstance(x, int | float):
        return None
    v = float(x)
    return v if math.isfinite(v) else None


def top_alternatives(entry: object) -> list[tuple[int, float]]:
    """SGLang's ``[[logprob, id, text], ...]`` for one token as ``(id, logprob)`` pairs (malformed ones dropped)."""
    out: list[tuple[int, float]] = []
    for e in entry if isinstance(entry, list) else []:
        if (
            isinstance(e, list | tuple)
            and len(e) >= 2
            and isinstance(e[1], int)
            and (v := finite_number(e[0])) is not None
        ):
            out.append((e[1], v))
    return out
