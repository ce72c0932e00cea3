"""The one retry policy: retries what it is told to, gives up as told, re-raises the last error."""

from __future__ import annotations

import pytest

from opengyre.retry import backoff


async def test_a_transient_error_is_retried_until_the_call_succeeds() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("away")
        return "ok"

    async for attempt in backoff("test", first_s=0.001, max_s=0.002, retry_on=ConnectionError):
        with attempt:
            result = await flaky()
    assert result == "ok" and len(calls) == 3


async def test_other_errors_and_refused_ones_are_not_retried() -> None:
    calls: list[int] = []
    with pytest.raises(ValueError, match="bad"):
        async for attempt in backoff("test", first_s=0.001, max_s=0.002, retry_on=ConnectionError):
            with attempt:
                calls.append(1)
                raise ValueError("bad")
    with pytest.raises(ConnectionError, match="refused"):
        async for attempt in backoff(
            "test", first_s=0.001, max_s=0.002, retry_on=ConnectionError, retry_if=lambda e: "refused" not in str(e)
        ):
            with attempt:
                calls.append(1)
                raise ConnectionError("refused")
    assert len(calls) == 2


async def test_it_gives_up_after_the_attempts_or_when_told_to_stop() -> None:
    calls: list[int] = []
    with pytest.raises(ConnectionError):
        async for attempt in backoff("test", first_s=0.001, max_s=0.002, retry_on=ConnectionError, attempts=4):
            with attempt:
                calls.append(1)
                raise ConnectionError("away")
    assert len(calls) == 4
    with pytest.raises(ConnectionError):
        async for attempt in backoff(
            "test", first_s=0.001, max_s=0.002, retry_on=ConnectionError, until=lambda: len(calls) >= 6
        ):
            with attempt:
                calls.append(1)
                raise ConnectionError("away")
    assert len(calls) == 6
