"""What a leader change looks like to a client, and how long it is waited out (the project's retry policy)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

from ..retry import backoff
from ._acks import AckError
from ._config import LogConfig
from ._errors import ELECTION_CODES, IN_PROCESS_CODES

__all__ = ["append_retryable", "deadline_s", "read_retryable", "waiting_out_election"]

log = logging.getLogger(__name__)

T = TypeVar("T")

# Connection states a publish or request meets while the client moves to another server of the cluster.
_MOVING = (
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.NoRespondersError,
)


def deadline_s(config: LogConfig) -> float:
    """How long an append or read waits out a server or leader that is away before it fails: ~10 s on one server
    (a restart), ~30 s on a cluster (an election after a leader died takes a few seconds, more under load)."""
    if config.retry_deadline_s > 0:
        return config.retry_deadline_s
    return 10.0 if config.replicas == 1 else 30.0


def append_retryable(exc: BaseException) -> bool:
    """A publish that may be sent again (the event id makes a second copy a duplicate the server drops): no
    acknowledgement, no stream leader (503, 10008), an earlier attempt still in process (10158). Never a refusal
    that would be repeated (10077 store failed, a full store, a wrong last sequence)."""
    if isinstance(exc, AckError):
        if exc.err_code in ELECTION_CODES or exc.err_code in IN_PROCESS_CODES:
            return True
        return exc.code == 503 and exc.err_code == 0  # no responders: nobody leads the stream yet
    return isinstance(exc, (TimeoutError, *_MOVING))


def read_retryable(exc: BaseException) -> bool:
    """A read (stream info, a consumer, a message by sequence) that a leader election answered or left unanswered."""
    if isinstance(exc, nats.js.errors.APIError):
        return exc.err_code in ELECTION_CODES
    return isinstance(exc, (TimeoutError, *_MOVING))


async def waiting_out_election(what: str, config: LogConfig, call: Callable[[], Awaitable[T]]) -> T:
    """``call()``, retried through the project's backoff while a leader election answers it (until the deadline;
    then its last error)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s(config)
    async for attempt in backoff(
        what, first_s=0.1, max_s=2.0, retry_if=read_retryable, until=lambda: loop.time() >= end, logger=log
    ):
        with attempt:
            return await call()
    raise AssertionError("unreachable: the backoff re-raises its last error")
