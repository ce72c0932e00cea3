"""BenchService over real gRPC: the roofline and the profiles, load runs and sweeps against the CPU engine over
real HTTP with their bench-run-completed in the log, and bad input refused precisely."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import pytest

from opengyre.config import Settings
from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import BenchRunCompleted
from opengyre.runtime import EmbeddedNats, grpc_channel, load_service, run_service
from opengyre.v1 import bench_pb2, bench_pb2_grpc, common_pb2

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
        async with grpc_channel(f"127.0.0.1:{ready.result()}", settings.grpc_token()) as ch:
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


@asynccontextmanager
async def _bench_stub(settings: Settings) -> AsyncIterator[bench_pb2_grpc.BenchServiceStub]:
    stop = asyncio.Event()
    ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    task = asyncio.create_task(run_service(load_service("bench"), settings, stop, port=0, ready=ready))
    try:
        done, _ = await asyncio.wait([task, ready], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            task.result()
        async with grpc_channel(f"127.0.0.1:{ready.result()}", settings.grpc_token()) as ch:
            yield bench_pb2_grpc.BenchServiceStub(ch)
    finally:
        stop.set()
        await task


def _trace() -> str:
    return json.dumps(
        [
            {
                "id": str(i),
                "conversations": [
                    {"from": "human", "value": f"question {i} " * 3},
                    {"from": "gpt", "value": "x" * 5},
                    {"from": "human", "value": "and then?"},
                    {"from": "gpt", "value": "y" * 3},
                ],
            }
            for i in range(3)
        ]
    )


async def _refused(call: Callable[[], Awaitable[object]], words: str) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call()
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert words in (err.value.details() or ""), err.value.details()


async def test_load_runs_and_sweeps_over_grpc_publish_bench_run_completed(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    settings = Settings(
        data_dir=tmp_path, nats_url=nats_server.url, db_url=f"sqlite:///{tmp_path / 'db.sqlite'}", log=log_config
    )
    async with EngineServer(EngineConfig(port=0, threads=1)) as eng, _bench_stub(settings) as stub:
        url, model = eng.url, eng.engine.config.model_name
        status = await stub.GetStatus(common_pb2.StatusRequest())
        assert {"run", "sweep"} <= set(status.capabilities) and not status.not_implemented

        run = await stub.Run(
            bench_pb2.BenchRunRequest(url=url, model=model, trace_json=_trace(), trace_name="t.json", concurrency=2)
        )
        doc = json.loads(run.result_json)
        assert not run.partial and doc["summary"]["requests_ok"] == 6
        assert doc["workload"]["form"] == "replay" and doc["summary"]["tokenizer_check"]["mismatched"] == 0
        synth = await stub.Run(
            bench_pb2.BenchRunRequest(
                url=url, model=model, trace_json=_trace(), trace_name="t.json", form="synthetic", concurrency=2
            )
        )
        sdoc = json.loads(synth.result_json)
        assert sdoc["workload"]["source"] == doc["workload"]["source"] and sdoc["summary"]["sessions_planned"] == 3

        updates = [
            u
            async for u in stub.Sweep(
                bench_pb2.BenchSweepRequest(
                    url=url,
                    model=model,
                    profile="chat",
                    length_scale=0.03,
                    concurrency=[1, 2, 4],
                    sessions_per_slot=2,
                    repeats=2,  # two complete repeats each: the step's interval exists from the start
                    max_repeats=3,
                    tool_latency_s=0.002,  # stated: replaces the profile's (none), recorded in the result
                    tolerance=100.0,  # any gain is surely "below tolerance": C* = 1, then one point beyond it
                    beyond=1,
                )
            )
        ]
        # one update per measurement of a point: C=1, C=2, and again for either if the step's test needed more
        assert [u.concurrency for u in updates[:2]] == [1, 2] and updates[-1].concurrency == 0
        assert {u.concurrency for u in updates[:-1]} == {1, 2}
        assert all(u.mean > 0 and len(u.throughputs) >= 2 for u in updates[:-1])
        result = json.loads(updates[-1].result_json)
        assert result["c_star"] == 1 and [p["concurrency"] for p in result["points"]] == [1, 2]
        assert not result["partial"] and result["max_repeats"] == 3
        assert result["profile"]["tool_latency"] == {"kind": "constant", "mean": 0.002}

        # a run's stated tool latency replaces its profile's (0: none), as `opengyre bench run --tool-latency`
        chat = json.loads((await stub.ListProfiles(bench_pb2.ListProfilesRequest())).profiles["chat"])
        two_turns = {
            **chat,
            "turns": {"kind": "constant", "mean": 2},
            "tool_latency": {"kind": "lognormal", "mean": 5.0, "sigma": 1.0},  # its own: 5 s between turns
        }
        stated = await stub.Run(
            bench_pb2.BenchRunRequest(
                url=url,
                model=model,
                profile=json.dumps(two_turns),
                length_scale=0.03,
                sessions=1,
                concurrency=1,
                tool_latency_s=0.01,
            )
        )
        sdoc2 = json.loads(stated.result_json)
        assert not stated.partial and sdoc2["summary"]["requests_ok"] == 2
        assert sdoc2["profile"]["tool_latency"] == {"kind": "constant", "mean": 0.01}
        none = await stub.Run(
            bench_pb2.BenchRunRequest(
                url="http://127.0.0.1:9",
                model=model,
                profile=json.dumps(two_turns),
                sessions=1,
                concurrency=1,
                tool_latency_s=0.0,
            )
        )
        assert json.loads(none.result_json)["profile"]["tool_latency"] is None
        kept = await stub.Run(
            bench_pb2.BenchRunRequest(
                url="http://127.0.0.1:9", model=model, profile=json.dumps(two_turns), sessions=1, concurrency=1
            )
        )
        assert json.loads(kept.result_json)["profile"]["tool_latency"]["mean"] == 5.0

        await _refused(lambda: stub.Run(bench_pb2.BenchRunRequest(url=url, model=model, profile="chat")), "concurrency")
        await _refused(
            lambda: stub.Run(
                bench_pb2.BenchRunRequest(url=url, model=model, trace_json=_trace(), form="exact", concurrency=1)
            ),
            "form must be one of replay, shadow, synthetic",
        )
        await _refused(
            lambda: stub.Run(bench_pb2.BenchRunRequest(url=url, model=model, profile="chatty", concurrency=1)),
            "neither a built-in",
        )
        await _refused(
            lambda: stub.Run(bench_pb2.BenchRunRequest(url=url, model=model, trace_json="[{", concurrency=1)),
            "trace_json is not valid JSON",
        )

        async def collect() -> None:
            req = bench_pb2.BenchSweepRequest(url=url, model=model, profile="chat", concurrency=[2, 1])
            async for _ in stub.Sweep(req):
                pass

        await _refused(collect, "strictly increasing")

        def sweep_call(**fields: object) -> Callable[[], Awaitable[None]]:
            async def call() -> None:
                req = bench_pb2.BenchSweepRequest(url=url, model=model, profile="chat", concurrency=[1], **fields)
                async for _ in stub.Sweep(req):
                    pass

            return call

        # refused before anything is sent, with the reason (the CLI's --max-repeats and --tool-latency checks)
        await _refused(sweep_call(repeats=4, max_repeats=2), "max_repeats at least repeats, got 4 and 2")
        await _refused(sweep_call(tool_latency_s=-0.5), "tool_latency must be a number of seconds >= 0, got -0.5")
        await _refused(
            lambda: stub.Run(
                bench_pb2.BenchRunRequest(
                    url=url, model=model, profile="chat", concurrency=1, tool_latency_s=float("nan")
                )
            ),
            "tool_latency must be a number of seconds >= 0, got nan",
        )
        await _refused(
            lambda: stub.Run(
                bench_pb2.BenchRunRequest(url=url, model=model, trace_json=_trace(), concurrency=1, tool_latency_s=1.0)
            ),
            "tool_latency_s change a profile; a trace is sent as recorded",
        )

        # an unreachable server: a result marked partial, not an error
        bad = await stub.Run(
            bench_pb2.BenchRunRequest(url="http://127.0.0.1:9", model=model, profile="chat", sessions=1, concurrency=1)
        )
        assert bad.partial and "server unreachable" in json.loads(bad.result_json)["summary"]["errors"][0]
        # a sweep against it stops at its first point, says why, and publishes no C*
        dead = [
            u
            async for u in stub.Sweep(
                bench_pb2.BenchSweepRequest(
                    url="http://127.0.0.1:9", model=model, profile="chat", concurrency=[1, 2], repeats=1
                )
            )
        ]
        assert [u.concurrency for u in dead] == [1, 0] and not dead[-1].run_id
        dres = json.loads(dead[-1].result_json)
        assert dres["partial"] and "no complete repeat at C=1 (server unreachable" in dres["stopped"]
        assert dres["c_star"] is None and dres["points"][0]["request_throughput_mean"] is None
        assert dres["max_repeats"] == 8  # unset: the CLI's default cap

    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = {e.run_id: (seq, e) async for seq, e in log.events(BenchRunCompleted)}
    finally:
        await log.close()
    assert set(events) == {
        run.run_id,
        synth.run_id,
        updates[-1].run_id,
        bad.run_id,
        stated.run_id,
        none.run_id,
        kept.run_id,
    }
    seq, ev = events[run.run_id]
    assert seq == run.event_seq and ev.profile == "replay:t.json" and ev.concurrency == 2
    assert ev.metrics["requests_ok"] == 6 and ev.metrics["e2el_p50_s"] > 0
    assert events[updates[-1].run_id][1].concurrency == 1 and events[bad.run_id][1].metrics["partial"] == 1.0
