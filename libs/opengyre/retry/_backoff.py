"""``async for attempt in backoff(...): with attempt: ...`` — tenacity's AsyncRetrying, configured once."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    stop_never,
    wait_exponential_jitter,
)
from tenacity.stop import stop_base

__all__ = ["backoff"]


def backoff(
    what: str,
    *,
    first_s: float,
    max_s: float,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    retry_if: Callable[[BaseException], bool] | None = None,
    attempts: int | None = None,
    until: Callable[[], bool] | None = None,
    logger: logging.Logger | None = None,
    before_sleep: Callable[[RetryCallState], Awaitable[None] | None] | None = None,
    log_level: int = logging.WARNING,
) -> AsyncRetrying:
    """Retry on ``retry_on`` (and ``retry_if`` of the error), waiting ``first_s`` doubling up to ``max_s``
    plus up to ``first_s`` of jitter (so many waiters do not come back at once); give up after ``attempts``
    or once ``until()`` is true, re-raising the last error. Each retry is logged as ``what`` at ``log_level``
    (DEBUG for a wait that is expected to retry, e.g. for a file a child writes once ready)."""

    def retryable(exc: BaseException) -> bool:
        return isinstance(exc, retry_on) and (retry_if is None or retry_if(exc))

    stop: stop_base = stop_after_attempt(attempts) if attempts is not None else stop_never
    if until is not None:
        cond = until
        stop = stop | _StopWhen(cond)
    out = logger or logging.getLogger("opengyre.retry")

    async def sleeping(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome else None
        wait = state.next_action.sleep if state.next_action else 0.0
        out.log(log_level, "%s: %s: %s; retry in %.2f s", what, type(exc).__name__, exc, wait)
        if before_sleep is not None:
            r = before_sleep(state)
            if r is not None:
                await r

    return AsyncRetrying(
        retry=retry_if_exception(retryable),
        wait=wait_exponential_jitter(multiplier=first_s, max=max_s, jitter=first_s),
        stop=stop,
        before_sleep=sleeping,
        reraise=True,
    )


class _StopWhen(stop_base):
    def __init__(self, cond: Callable[[], bool]) -> None:
        self.cond = cond

    def __call__(self, retry_state: RetryCallState) -> bool:
        return self.cond()
