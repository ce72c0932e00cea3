"""Every RPC of every service requires the stack's bearer token (health and reflection excepted): a call without
it, or with a wrong one, is refused with UNAUTHENTICATED, the admin RPCs (the proxy's AddEngine and DrainEngine,
the scheduler's SetCellEngine ...) included; with the token the call goes through."""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc

from opengyre.config import Settings, ensure_grpc_token, grpc_token_file
from opengyre.eventlog import LogConfig
from opengyre.runtime import SERVICE_CLASSES, EmbeddedNats, grpc_channel, load_service, run_service
from opengyre.v1 import common_pb2


@pytest.mark.parametrize("name", sorted(SERVICE_CLASSES))
async def test_every_rpc_of_a_service_refuses_a_caller_without_the_token(
    name: str, nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
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
        addr = f"127.0.0.1:{ready.result()}"
        token = settings.grpc_token()
        assert token
        own = f"opengyre.v1.{name.capitalize()}Service"
        methods = descriptor_pool.Default().FindServiceByName(own).methods
        assert methods
        refused: dict[str, list[str]] = {"none": [], "wrong": []}
        for who, sent in (("none", None), ("wrong", token + "x")):
            async with grpc_channel(addr, sent) as ch:
                for m in methods:
                    path = f"/{own}/{m.name}"
                    # Raw bytes (an empty message): refused before the request is even decoded.
                    if m.server_streaming:
                        call = ch.unary_stream(path)(b"", timeout=10)
                        try:
                            async for _ in call:
                                pass
                        except grpc.aio.AioRpcError as exc:
                            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                                refused[who].append(m.name)
                        continue
                    try:
                        await ch.unary_unary(path)(b"", timeout=10)
                    except grpc.aio.AioRpcError as exc:
                        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                            refused[who].append(m.name)
        names = sorted(m.name for m in methods)
        assert sorted(refused["none"]) == names, refused
        assert sorted(refused["wrong"]) == names, refused
        admin = {"proxy": {"AddEngine", "DrainEngine"}, "scheduler": {"SetCellEngine", "ForceRole", "DrainCell"}}
        assert admin.get(name, set()) <= set(names)
        # Health stays open (healthchecks probe it); with the token the service answers.
        async with grpc_channel(addr, None) as ch:
            h = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)
            assert h.status == health_pb2.HealthCheckResponse.SERVING
        async with grpc_channel(addr, token) as ch:
            stub_mod = __import__(f"opengyre.v1.{name}_pb2_grpc", fromlist=["x"])
            stub = getattr(stub_mod, f"{name.capitalize()}ServiceStub")(ch)
            st = await stub.GetStatus(common_pb2.StatusRequest(), timeout=10)
            assert st.service == name
    finally:
        stop.set()
        await task


def test_the_token_is_private_to_its_owner_and_kept_across_starts(tmp_path: Path) -> None:
    first = ensure_grpc_token(tmp_path)
    mode = stat.S_IMODE(grpc_token_file(tmp_path).stat().st_mode)
    assert mode == 0o600, oct(mode)
    assert len(first) >= 32
    assert ensure_grpc_token(tmp_path) == first  # a second `up` resumes with the same token
    assert ensure_grpc_token(tmp_path / "other") != first  # another data dir, another stack's token
