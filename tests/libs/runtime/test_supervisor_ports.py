"""Two stacks that start at once on the same default ports: each service binds its port itself and reports the
one it got, so the stacks end up on distinct ports and both serve (a check that a port is free, made before the
service binds it, let both take it: gRPC's SO_REUSEPORT then split connections between them)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from opengyre.config import SERVICE_PORTS, Settings
from opengyre.runtime import Stack, free_port, grpc_channel
from opengyre.v1 import common_pb2, proxy_pb2_grpc, scheduler_pb2_grpc, synth_pb2_grpc

# Starts two stacks of three services each (tens of seconds on a shared 2-core machine).
pytestmark = pytest.mark.slow

STUBS = {
    "synth": synth_pb2_grpc.SynthServiceStub,
    "proxy": proxy_pb2_grpc.ProxyServiceStub,
    "scheduler": scheduler_pb2_grpc.SchedulerServiceStub,
}


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(kv.decode().split("=", 1) for kv in raw if b"=" in kv)


async def test_two_stacks_started_at_once_get_distinct_ports_and_both_serve(tmp_path: Path) -> None:
    # Free now: both stacks want the same ones. Another xdist worker taking one in between is the case under
    # test too (a taken default is replaced by a free port), so this use does not race.
    defaults = {name: free_port() for name in SERVICE_PORTS}
    http = free_port()
    stacks = [
        Stack(Settings(data_dir=tmp_path / x, ports=dict(defaults), proxy_http_port=http), services=list(STUBS))
        for x in "ab"
    ]
    try:
        await asyncio.gather(*(s.start() for s in stacks))
        a, b = ({n: c.port for n, c in s.children.items()} for s in stacks)
        assert set(a.values()).isdisjoint(b.values()), (a, b)
        for stack in stacks:
            for name, child in stack.children.items():
                async with grpc_channel(f"127.0.0.1:{child.port}", stack.settings.grpc_token()) as ch:
                    health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest())
                    assert health.status == health_pb2.HealthCheckResponse.SERVING
                    status = await STUBS[name](ch).GetStatus(common_pb2.StatusRequest())  # type: ignore[no-untyped-call]
                    assert status.service == name
            # The scheduler was told where its own stack's proxy really is, not the default.
            assert stack.children["scheduler"].proc is not None
            env = _environ(stack.children["scheduler"].proc.pid)
            assert env["OPENGYRE_PROXY_PORT"] == str(stack.children["proxy"].port)
    finally:
        await asyncio.gather(*(s.stop() for s in stacks), return_exceptions=True)
