"""A service in-process: gRPC health, reflection, GetStatus with projections; bad settings fail clearly."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.config import Settings
from opengyre.eventlog import LogConfig, LogUnavailable
from opengyre.events import SkillIngested
from opengyre.runtime import DataDirLock, EmbeddedNats, free_port, grpc_channel, load_service, run_service
from opengyre.v1 import common_pb2, synth_pb2_grpc

from ..._polling import await_until


@pytest.fixture
async def synth(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> AsyncIterator[tuple[int, Settings]]:
    settings = Settings(data_dir=tmp_path, nats_url=nats_server.url, log=log_config)
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(load_service("synth"), settings, stop, port=0, ready=ready))
    port = await asyncio.wait_for(ready, 60)
    yield port, settings
    stop.set()
    await task


async def test_a_skeleton_service_answers_health_reflection_and_status(synth: tuple[int, Settings]) -> None:
    port, settings = synth
    async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
        for name in ("", "opengyre.v1.SynthService"):
            got = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=name))
            assert got.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)
        responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        async for r in responses:
            names = {s.name for s in r.list_services_response.service}
            break
        assert {"opengyre.v1.SynthService", "grpc.health.v1.Health"} <= names
        status = await synth_pb2_grpc.SynthServiceStub(ch).GetStatus(common_pb2.StatusRequest())
    assert status.service == "synth"
    assert not status.not_implemented  # Skill2Env is implemented: nothing listed as missing
    assert any("hardening loop" in c for c in status.capabilities)
    assert [p.name for p in status.projections] == ["tasks", "hardening"]


async def test_status_reports_projection_progress(synth: tuple[int, Settings], nats_server: EmbeddedNats) -> None:
    port, settings = synth
    from opengyre.eventlog import EventLog

    log = await EventLog.connect(nats_server.url, settings.log)
    try:
        await log.append_many([SkillIngested(skill_id=f"s{i}", name=f"skill-{i}", description="d") for i in range(5)])
    finally:
        await log.close()
    async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
        stub = synth_pb2_grpc.SynthServiceStub(ch)
        for _ in range(300):
            st = (await stub.GetStatus(common_pb2.StatusRequest())).projections[0]
            if st.position == 5 and st.pending == 0:
                break
            await asyncio.sleep(0.05)
    assert (st.position, st.pending, st.tracked, st.dead_letters, st.stream_last_seq) == (5, 0, 5, 0, 5)


async def test_a_service_without_a_log_fails_with_a_clear_message(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, nats_url=f"nats://127.0.0.1:{free_port()}")  # nobody answers
    with pytest.raises(LogUnavailable, match="no NATS server answers"):
        await run_service(load_service("synth"), settings, asyncio.Event(), port=0)
    with pytest.raises(RuntimeError, match="no NATS URL"):
        await run_service(load_service("synth"), replace(settings, nats_url=None), asyncio.Event(), port=0)
    with pytest.raises(KeyError, match="unknown service 'warp'"):
        load_service("warp")


async def test_a_projection_refusing_a_recreated_stream_says_so_in_status_and_the_cli(
    synth: tuple[int, Settings], nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The service stays up (a restart would refuse again) and every status surface names the error."""
    port, settings = synth
    from opengyre.eventlog import EventLog

    log = await EventLog.connect(nats_server.url, settings.log)
    try:
        await log.append_many([SkillIngested(skill_id=f"s{i}", name=f"skill-{i}", description="d") for i in range(3)])
        async with grpc_channel(f"127.0.0.1:{port}", settings.grpc_token()) as ch:
            stub = synth_pb2_grpc.SynthServiceStub(ch)

            async def position() -> int:
                return int((await stub.GetStatus(common_pb2.StatusRequest())).projections[0].position)

            async def folded() -> bool:
                return await position() == 3

            await await_until(folded, "synth folds the first stream")
            await log.js.delete_stream(settings.log.stream)
            await log.ensure_stream()
            await log.append_many([SkillIngested(skill_id=f"n{i}", name=f"new-{i}", description="d") for i in range(5)])

            async def error() -> str:
                return str((await stub.GetStatus(common_pb2.StatusRequest())).projections[0].error)

            await await_until(error, "GetStatus reports the refusal")
            assert "deleted and re-created" in await error()
            assert await position() == 3  # nothing of the new stream folded onto the old positions
            health = await health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=""))
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await log.close()

    # `opengyre status` of a stack whose synth is this one (this process holds the data dir as its supervisor
    # would): the error is printed and the exit code says so.
    data = tmp_path / "stack"
    lock = DataDirLock(data)
    lock.acquire("up")
    (data / "stack.json").write_text(
        json.dumps(
            {
                "pid": os.getpid(),
                "host": "127.0.0.1",
                "nats_url": nats_server.url,
                "services": {"synth": {"port": port}},
            }
        )
    )
    env = {"COLUMNS": "250", "OPENGYRE_STREAM": settings.log.stream, "OPENGYRE_SUBJECT_PREFIX": settings.log.prefix}
    env["OPENGYRE_GRPC_TOKEN"] = str(settings.grpc_token())  # synth's (its data dir is not this one)
    res = await asyncio.to_thread(CliRunner().invoke, app, ["status", "--data-dir", str(data)], env=env)
    assert res.exit_code == 1, res.output
    assert "REFUSES THE STREAM" in res.output and "error: projection tasks folded stream" in res.output
    # `opengyre projections list` against the same store says it too.
    args = ["projections", "list", "--data-dir", str(data), "--nats-url", nats_server.url]
    res = await asyncio.to_thread(CliRunner().invoke, app, [*args, "--db-url", settings.store_url("synth")], env=env)
    lock.release()
    assert res.exit_code == 1, res.output
    assert "REFUSES THE STREAM" in res.output and "error: projection tasks folded stream" in res.output
