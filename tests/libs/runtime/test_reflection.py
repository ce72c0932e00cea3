"""gRPC reflection describes every service it lists, for each of the five services (what grpcurl needs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import ProtoReflectionDescriptorDatabase

from opengyre.config import Settings
from opengyre.eventlog import LogConfig
from opengyre.runtime import SERVICE_CLASSES, EmbeddedNats, GrpcServer, load_service, run_service


def _describe(port: int) -> dict[str, list[str]]:
    """Every service the server lists, described through reflection alone (as grpcurl does): its methods."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        db = ProtoReflectionDescriptorDatabase(channel)
        pool = descriptor_pool.DescriptorPool(db)
        return {name: [m.name for m in pool.FindServiceByName(name).methods] for name in db.get_services()}


@pytest.mark.parametrize("name", sorted(SERVICE_CLASSES))
async def test_reflection_describes_every_listed_service(
    name: str, nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    """Before: SynthService and BenchService were listed but their descriptors were never loaded."""
    settings = Settings(
        data_dir=tmp_path,
        nats_url=nats_server.url,
        db_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        log=log_config,
        proxy_http_port=0,
    )
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(load_service(name), settings, stop, port=0, ready=ready))
    try:
        done, _ = await asyncio.wait([task, ready], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        described = await asyncio.to_thread(_describe, ready.result())
    finally:
        stop.set()
        await task
    own = f"opengyre.v1.{name.capitalize()}Service"
    assert {own, "grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection"} <= set(described)
    assert "GetStatus" in described[own]
    assert all(described.values()), described


async def test_a_service_name_without_a_loaded_descriptor_is_refused_at_registration() -> None:
    server = GrpcServer("127.0.0.1", 0, token="t")
    with pytest.raises(RuntimeError, match=r"opengyre\.v1\.NoSuchService .* reflection could not describe it"):
        server.register(["opengyre.v1.NoSuchService"])
