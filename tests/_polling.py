"""Waiting for a condition in tests: a bounded number of polls, never a comparison with the clock.

Tests check what happens, not how fast (timings live in bench/); the bound only keeps a broken run from hanging.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable

__all__ = ["await_until", "wait_until"]


def wait_until(pred: Callable[[], object], what: str, *, polls: int = 600, every: float = 0.2) -> None:
    """Poll ``pred`` until it is true; AssertionError(``what``) after ``polls`` tries."""
    for _ in range(polls):
        if pred():
            return
        time.sleep(every)
    raise AssertionError(f"{what}: not reached after {polls} polls")


async def await_until(
    pred: Callable[[], object | Awaitable[object]],
    what: str | Callable[[], str],
    *,
    polls: int = 600,
    every: float = 0.05,
) -> None:
    """``wait_until`` inside an event loop; ``pred`` may be a coroutine function, ``what`` a function saying the
    state at the failure."""
    for _ in range(polls):
        ok = pred()
        if inspect.isawaitable(ok):
            ok = await ok
        if ok:
            return
        await asyncio.sleep(every)
    raise AssertionError(f"{what() if callable(what) else what}: not reached after {polls} polls")
