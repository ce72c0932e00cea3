"""BenchService over real gRPC: the roofline and the profiles, and a bad config refused precisely."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import grpc
import pytest

from opengyre.config import Settings
from opengyre.eventlog import LogConfig
from opengyre.runtime import EmbeddedNats, load_service, run_service
from opengyre.v1 import bench_pb2, bench_pb2_grpc

from ._configs import LLAMA_31_8B


async def test_roofline_and_profiles_over_grpc(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(load_service("bench"), settings, stop, port=0, ready=ready))
    try:
        done, _ = await asyncio.wait([task, ready], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{ready.result()}") as ch:
            stub = bench_pb2_grpc.BenchServiceStub(ch)
            profiles = await stub.ListProfiles(bench_pb2.ListProfilesRequest())
            assert set(profiles.profiles) == {"chat", "chatbot", "coding", "terminal", "computer-use"}
            assert json.loads(profiles.profiles["coding"])["output"]["mean"] == 32
            r = await stub.Roofline(
                bench_pb2.RooflineRequest(config_json=json.dumps(LLAMA_31_8B), hardware="H100", isl=32000, osl=768)
            )
            assert round(r.ridge) == 295 and r.max_concurrency == 14
            assert r.prefill_projection_oi > 295 > r.decode_projection_oi
            bad = {k: v for k, v in LLAMA_31_8B.items() if k != "num_key_value_heads"}
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Roofline(
                    bench_pb2.RooflineRequest(config_json=json.dumps(bad), hardware="H100", isl=10, osl=1)
                )
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "num_key_value_heads" in (err.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.Roofline(bench_pb2.RooflineRequest(config_json="{", hardware="H100", isl=10, osl=1))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        stop.set()
        await task
