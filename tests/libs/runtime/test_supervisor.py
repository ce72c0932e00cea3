"""The supervisor's restart limit: a service that keeps exiting with the same error fails what waits on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opengyre.config import Settings
from opengyre.runtime import ServiceFailed, Stack, free_port
from opengyre.runtime._supervisor import _Child


async def test_a_service_failing_the_same_way_on_every_restart_fails_the_work_with_its_last_error(
    tmp_path: Path,
) -> None:
    # A service name no service has: the real runner exits with the same error on every start.
    stack = Stack(Settings(data_dir=tmp_path), services=[], max_restarts=2)
    child = _Child("no-such-service", free_port())  # never bound: the service fails before it listens
    stack.children[child.name] = child
    stack._spawn(child, fallback=False)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        with pytest.raises(ServiceFailed, match=r"service no-such-service exited with \d+ after 2 restart\(s\): .+"):
            await stack.watch(asyncio.Event().wait())  # work that would wait for ever
    finally:
        stop.set()
        await supervisor
    assert child.restarts == 2 and child.proc is not None and child.proc.poll() is not None
    assert "no-such-service" in str(stack.gave_up)
