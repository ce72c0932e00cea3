"""Waiting on the services through the project's retry helper (``opengyre.retry.backoff``, tenacity): a refusal
that means "not now" (the policy holds a step, the cells are full, a service is being restarted) or a condition
that does not hold yet (``NotYet``) is asked again; the last refusal is raised once the attempts are spent."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import grpc

from opengyre.retry import backoff

__all__ = ["AWAY", "NOT_NOW", "WAITS", "NotYet", "not_yet_or", "until_accepted", "until_caught_up", "up"]

T = TypeVar("T")
AWAY = (grpc.StatusCode.UNAVAILABLE,)  # a service the supervisor is restarting
NOT_NOW = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, *AWAY)
# Waits on the policy, capacity or a projection are the loop's normal pace, not warnings: their retries are not
# logged (a wait that gives up still raises its last refusal).
WAITS = logging.getLogger(f"{__name__}.waits")
WAITS.setLevel(logging.ERROR)
WAIT_ATTEMPTS = 1200  # at most 1 s apart: ~20 minutes


class NotYet(Exception):
    """A condition waited for does not hold yet (``backoff`` asks again)."""


def not_yet_or(*codes: grpc.StatusCode) -> Callable[[BaseException], bool]:
    def retryable(exc: BaseException) -> bool:
        return isinstance(exc, NotYet) or (isinstance(exc, grpc.aio.AioRpcError) and exc.code() in codes)

    return retryable


async def until_accepted(call: Callable[[], Awaitable[T]], codes: tuple[grpc.StatusCode, ...], what: str) -> T:
    """Call until the service accepts: a refusal with one of ``codes`` means "not now" (the policy holds the
    step, cells are full, a projection has not caught up, the service is being restarted by the supervisor), so
    it is asked again; after ``WAIT_ATTEMPTS`` the last refusal is raised."""
    async for attempt in backoff(
        what, first_s=0.1, max_s=1.0, retry_if=not_yet_or(*codes), attempts=WAIT_ATTEMPTS, logger=WAITS
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable: backoff re-raises its last error")


async def until_caught_up(call: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """Read until ``done(reply)``: a projection folding what another service just appended."""

    async def checked() -> T:
        got = await call()
        if not done(got):
            raise NotYet("not caught up yet")
        return got

    return await until_accepted(checked, AWAY, "waiting for a projection to catch up")


async def up(call: Callable[[], Awaitable[T]]) -> T:
    """A read that waits out a service's restart."""
    return await until_accepted(call, AWAY, "waiting for a service to come back")
