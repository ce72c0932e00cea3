"""The proxy as a service: its gateway on HTTP, its store as a projection, ProxyService over gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import openai
import pytest

from opengyre.config import Settings
from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CellRegistered, PayloadsCompacted
from opengyre.proxy.service import ProxyService
from opengyre.runtime import EmbeddedNats, grpc_channel, run_service
from opengyre.v1 import common_pb2, proxy_pb2, proxy_pb2_grpc

M = "opengyre-tiny"


@contextlib.asynccontextmanager
async def _running(service: ProxyService, settings: Settings) -> AsyncIterator[proxy_pb2_grpc.ProxyServiceStub]:
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(service, settings, stop, port=0, ready=ready))
    done, _ = await asyncio.wait([task, ready], return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        task.result()
    channel = grpc_channel(f"127.0.0.1:{ready.result()}", settings.grpc_token())
    try:
        yield proxy_pb2_grpc.ProxyServiceStub(channel)
    finally:
        await channel.close()
        stop.set()
        await task


async def test_operators_drive_the_proxy_over_grpc(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    settings = Settings(
        data_dir=tmp_path,
        nats_url=nats_server.url,
        db_url=f"sqlite:///{tmp_path / 'p.db'}",
        log=log_config,
        proxy_http_port=0,
    )
    service = ProxyService(engines=[engine_a.url])
    async with _running(service, settings) as stub:
        assert service.gateway is not None
        assert (tmp_path / "proxy.url").read_text().strip() == service.gateway.url
        status = await stub.GetStatus(common_pb2.StatusRequest())
        assert status.service == "proxy" and [p.name for p in status.projections] == ["trajectories"]
        assert "tito" in status.capabilities

        access = await stub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id="ex-svc"))
        # The context it serves (what it enforces), so a harness can compact before it is refused.
        assert access.context_length == service.gateway.served_context().tokens > 0
        client = openai.AsyncOpenAI(base_url=access.base_url, api_key=access.api_key, max_retries=0)
        m1: list[Any] = [{"role": "user", "content": "hi"}]
        r1 = await client.chat.completions.create(model=M, messages=m1, max_tokens=4)
        m2 = [
            *m1,
            {"role": "assistant", "content": r1.choices[0].message.content or ""},
            {"role": "user", "content": "more"},
        ]
        await client.chat.completions.create(model=M, messages=m2, max_tokens=4)

        # A cell registered in the log joins the pool.
        log = await EventLog.connect(nats_server.url, log_config)
        try:
            await log.append(CellRegistered(cell_id="cell-b", role="rollout", engine_url=engine_b.url))
        finally:
            await log.close()
        for _ in range(500):
            engines = await stub.ListEngines(proxy_pb2.ListEnginesRequest())
            if len(engines.engines) == 2:
                break
            await asyncio.sleep(0.01)
        assert sorted((e.engine_id, e.source) for e in engines.engines) == [("cell-b", "cell"), ("static-0", "static")]

        for _ in range(500):
            listed = await stub.ListExecutions(proxy_pb2.ListExecutionsRequest(execution_ids=["ex-svc"]))
            if listed.executions and listed.executions[0].calls == 2:
                break
            await asyncio.sleep(0.02)
        summary = listed.executions[0]
        assert summary.calls == 2 and summary.roots == 1 and summary.stored_tokens < summary.flat_tokens
        tree = await stub.GetTree(proxy_pb2.GetTreeRequest(execution_id="ex-svc"))
        assert [n.branch for n in tree.nodes] == ["root", "extension"] and len(tree.leaves) == 1
        path = await stub.GetPath(proxy_pb2.GetPathRequest(execution_id="ex-svc", leaf_call_id=tree.leaves[0]))
        assert len(path.tokens) == len(path.generated) == len(path.behaviour_logprobs)
        assert sum(path.generated) == sum(n.output_len for n in tree.nodes)
        atif = json.loads((await stub.ExportAtif(proxy_pb2.ExportAtifRequest(execution_id="ex-svc"))).json)
        assert atif["schema_version"] == "ATIF-v1.7" and atif["session_id"] == "ex-svc"
        done = await stub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id="ex-done"))
        ended = openai.AsyncOpenAI(base_url=done.base_url, api_key=done.api_key, max_retries=0)
        await ended.chat.completions.create(model=M, messages=m1, max_tokens=4)
        sealed = await stub.SealExecution(proxy_pb2.SealExecutionRequest(execution_id="ex-done"))
        assert (sealed.execution_id, sealed.recorded_calls) == ("ex-done", 1)
        with pytest.raises(openai.PermissionDeniedError):
            await ended.chat.completions.create(model=M, messages=m1, max_tokens=4)
        with pytest.raises(grpc.aio.AioRpcError) as refused:  # no new key for a sealed execution (issue 24 item 6)
            await stub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id="ex-done", role="main"))
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "sealed" in str(refused.value.details())

        moved = await stub.DrainEngine(proxy_pb2.DrainEngineRequest(engine_id="static-0"))
        assert moved.moved == 0
        assert [e.engine_id for e in (await stub.ListEngines(proxy_pb2.ListEnginesRequest())).engines] == ["cell-b"]
        added = await stub.AddEngine(proxy_pb2.AddEngineRequest(engine_id="back", url=engine_a.url))
        assert added.state == "active" and added.source == "grpc"

        for call, code in [
            (stub.GetTree(proxy_pb2.GetTreeRequest(execution_id="nobody")), grpc.StatusCode.NOT_FOUND),
            (stub.DrainEngine(proxy_pb2.DrainEngineRequest(engine_id="nope")), grpc.StatusCode.NOT_FOUND),
            (stub.AddEngine(proxy_pb2.AddEngineRequest(url="ftp://x")), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.AddEngine(proxy_pb2.AddEngineRequest(url="https://x")), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id="a.b")), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.SealExecution(proxy_pb2.SealExecutionRequest(execution_id="a.b")), grpc.StatusCode.INVALID_ARGUMENT),
            (
                stub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id="a", role="boss")),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (
                stub.GetPath(proxy_pb2.GetPathRequest(execution_id="ex-svc", leaf_call_id="zz")),
                grpc.StatusCode.NOT_FOUND,
            ),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call
            assert err.value.code() == code
    # Keys survive a restart: the secret lives in the data dir.
    again = ProxyService(engines=[engine_a.url])
    async with _running(again, settings) as stub2:
        assert again.gateway is not None
        r = await openai.AsyncOpenAI(
            base_url=again.gateway.base_url("ex-svc"), api_key=access.api_key, max_retries=0
        ).chat.completions.create(model=M, messages=m1, max_tokens=2)
        assert r.choices[0].finish_reason in ("stop", "length")
        assert (await stub2.GetStatus(common_pb2.StatusRequest())).service == "proxy"

        # Retention compacts ex-svc (as the trainer does once a step consumed it): its shape stays, its tokens
        # are refused with the reason, never invented.
        log = await EventLog.connect(nats_server.url, log_config)
        try:
            await log.payloads.purge("ex-svc")
            await log.append(PayloadsCompacted(execution_id="ex-svc", step=1))
        finally:
            await log.close()
        leaf = tree.leaves[0]
        for _ in range(500):
            try:
                await stub2.GetPath(proxy_pb2.GetPathRequest(execution_id="ex-svc", leaf_call_id=leaf))
            except grpc.aio.AioRpcError as err:
                assert err.code() == grpc.StatusCode.FAILED_PRECONDITION  # payload-missing until it is folded
                if "payload-compacted" in str(err.details()):
                    break
            await asyncio.sleep(0.02)
        else:
            raise AssertionError("the compaction was never folded")
        shape = await stub2.GetTree(proxy_pb2.GetTreeRequest(execution_id="ex-svc"))
        assert [n.output_len for n in shape.nodes][:2] == [n.output_len for n in tree.nodes]
    # After another restart the gateway cannot restore ex-svc's state: a clear error, not a silent new root.
    third = ProxyService(engines=[engine_a.url])
    async with _running(third, settings):
        assert third.gateway is not None
        with pytest.raises(openai.BadRequestError, match="compacted"):
            await openai.AsyncOpenAI(
                base_url=third.gateway.base_url("ex-svc"), api_key=access.api_key, max_retries=0
            ).chat.completions.create(model=M, messages=m1, max_tokens=2)
