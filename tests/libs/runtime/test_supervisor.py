"""The supervisor's restart limit: a service that keeps exiting with the same error fails what waits on it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from opengyre.config import Settings
from opengyre.runtime import ServiceFailed, Stack, free_port
from opengyre.runtime._supervisor import _Child

from ..._polling import await_until


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


async def test_the_log_health_watch_keeps_one_client_across_a_nats_server_restart_and_closes_it(
    tmp_path: Path,
) -> None:
    # A client per /healthz check built an SSL context every second: most of an idle supervisor's CPU.
    stack = Stack(Settings(data_dir=tmp_path / "data"), services=[], health_every=0.1)
    await stack.start()
    stop = asyncio.Event()
    supervisor = asyncio.create_task(stack.supervise(stop))
    try:
        await await_until(lambda: any(p._client is not None for p in stack._probes.values()), "a first check")
        [probe] = stack._probes.values()
        client = probe._client
        assert stack.nats is not None and stack.nats.proc is not None
        stack.nats.proc.kill()  # restarted on the same ports; health is "restarting" until a check says ok
        await await_until(lambda: stack._log.restarts == 1 and stack._log.health.ok, "healthy after the restart")
        assert list(stack._probes.values()) == [probe] and probe._client is client
    finally:
        stop.set()
        await supervisor
        await stack.stop()
    assert not stack._probes and probe._client is None
