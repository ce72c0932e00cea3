"""The bench service process: gRPC BenchService with health and reflection."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any

import grpc

from opengyre.runtime import Service, ServiceContext
from opengyre.v1 import bench_pb2, bench_pb2_grpc, common_pb2

from ._hardware import hardware
from ._profiles import PAPER_PROFILES, ProfileError
from ._report import completed_event
from ._roofline import ConfigError, ModelShape, roofline_report
from ._runs import SWEEP_MAX_REPEATS, RunSpec, execute_run, profile_from, sweep_profile
from ._sweep import SweepPoint

__all__ = ["BenchService"]


def _or(value: float, default: float) -> float:
    return value if value else default


def _tool_latency(req: bench_pb2.BenchRunRequest | bench_pb2.BenchSweepRequest) -> float | None:
    """The stated tool latency (seconds), or None when the field is unset: the profile's own is kept."""
    return req.tool_latency_s if req.HasField("tool_latency_s") else None


def _run_spec(req: bench_pb2.BenchRunRequest) -> RunSpec:
    """The request in the CLI's terms; a clear ``ProfileError``/``ValueError`` for what cannot be run."""
    if not req.url or not req.model:
        raise ValueError("url and model are required")
    if req.concurrency == 0:
        raise ValueError("concurrency must be positive")
    if bool(req.trace_json) == bool(req.profile):
        raise ValueError("give a profile or a trace_json (one of them)")
    scales = (_or(req.length_scale, 1.0), _or(req.turn_scale, 1.0))
    tool_latency = _tool_latency(req)
    trace: Any = None
    if req.trace_json:
        if scales != (1.0, 1.0) or tool_latency is not None:
            raise ValueError(
                "length_scale, turn_scale and tool_latency_s change a profile; a trace is sent as recorded"
            )
        try:
            trace = json.loads(req.trace_json)
        except ValueError as e:
            raise ProfileError(f"trace_json is not valid JSON: {e}") from None
    return RunSpec(
        req.url,
        req.model,
        form=(req.form or "replay") if trace is not None else (req.form or "synthetic"),
        profile=profile_from(req.profile, *scales, tool_latency) if req.profile else None,
        trace=trace,
        trace_format=req.trace_format or "sharegpt",
        trace_name=req.trace_name or "trace",
        sessions=req.sessions or None,
        concurrency=req.concurrency,
        rate=req.rate or None,
        workers=req.workers or 1,
        seed=req.seed,
    )


class _Servicer(bench_pb2_grpc.BenchServiceServicer):
    def __init__(self, service: Service, ctx: ServiceContext) -> None:
        self._service = service
        self._ctx = ctx
        self._tok: Any = None

    def _tokenizer(self) -> Any:
        if self._tok is None:
            from opengyre.models import load_tokenizer

            self._tok = load_tokenizer()
        return self._tok

    async def Run(  # noqa: N802
        self, request: bench_pb2.BenchRunRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bench_pb2.BenchRunResponse:
        try:
            spec = _run_spec(request)
            result, doc = await execute_run(spec, self._tokenizer())
        except ValueError as e:  # ProfileError and CompareError are ValueErrors
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from e
        event = completed_event(None, spec.label, spec.concurrency, spec.url, doc["summary"])
        seq = (await self._ctx.log.append(event)).seq
        return bench_pb2.BenchRunResponse(
            run_id=event.run_id, result_json=json.dumps(doc, default=str), partial=result.partial, event_seq=seq
        )

    async def Sweep(  # noqa: N802
        self, request: bench_pb2.BenchSweepRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bench_pb2.BenchSweepUpdate]:
        updates: asyncio.Queue[SweepPoint] = asyncio.Queue()
        task: asyncio.Future[Any] | None = None
        try:
            if not request.url or not request.model or not request.profile:
                raise ValueError("url, model and profile are required")
            prof = profile_from(
                request.profile,
                _or(request.length_scale, 1.0),
                _or(request.turn_scale, 1.0),
                _tool_latency(request),
            )
            repeats = request.repeats or 2
            task = asyncio.ensure_future(
                sweep_profile(
                    request.url,
                    request.model,
                    prof,
                    list(request.concurrency),
                    self._tokenizer(),
                    sessions_per_slot=request.sessions_per_slot or 3,
                    repeats=repeats,
                    # unset: the CLI's default cap (or repeats if larger); one below repeats is refused by the
                    # sweep before it sends anything, as the CLI refuses --max-repeats below --repeats
                    max_repeats=request.max_repeats or max(repeats, SWEEP_MAX_REPEATS),
                    tolerance=_or(request.tolerance, 0.05),
                    beyond=request.beyond or 2,
                    workers=request.workers or 1,
                    progress=updates.put_nowait,
                )
            )
            while not task.done() or not updates.empty():
                get = asyncio.ensure_future(updates.get())
                await asyncio.wait([task, get], return_when=asyncio.FIRST_COMPLETED)
                if get.done():
                    p = get.result()
                    yield bench_pb2.BenchSweepUpdate(concurrency=p.concurrency, throughputs=p.throughputs, mean=p.mean)
                else:
                    get.cancel()
            result = task.result()
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise AssertionError("unreachable") from e
        finally:
            if task is not None and not task.done():  # the client went away: stop sending load
                task.cancel()
        last = bench_pb2.BenchSweepUpdate(
            result_json=json.dumps({"profile": prof.to_dict(), "url": request.url, **result.to_dict()}, default=str)
        )
        if result.c_star is not None and result.stopped is None:
            best = next(p for p in result.points if p.concurrency == result.c_star)
            event = completed_event(None, prof.name, result.c_star, request.url, best.summaries[-1])
            last.run_id, last.event_seq = event.run_id, (await self._ctx.log.append(event)).seq
        yield last

    async def GetStatus(  # noqa: N802 (gRPC method name)
        self, request: common_pb2.StatusRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> common_pb2.ServiceStatus:
        return await self._ctx.status(self._service)

    async def ListProfiles(  # noqa: N802
        self, request: bench_pb2.ListProfilesRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bench_pb2.ListProfilesResponse:
        return bench_pb2.ListProfilesResponse(profiles={n: json.dumps(p.to_dict()) for n, p in PAPER_PROFILES.items()})

    async def Roofline(  # noqa: N802
        self, request: bench_pb2.RooflineRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> bench_pb2.RooflineResponse:
        try:
            if request.isl == 0 or request.osl == 0:
                raise ValueError("isl and osl must be positive")
            try:
                cfg = json.loads(request.config_json)
            except ValueError as e:
                raise ConfigError(f"config_json is not valid JSON: {e}") from None
            shape = ModelShape.from_config(cfg)
            hw = hardware(request.hardware)
            doc = roofline_report(
                shape,
                hw,
                isl=request.isl,
                osl=request.osl,
                batch=request.batch or 1,
                tp=request.tp or 1,
                memory_utilisation=request.memory_utilisation or 1.0,
            )
        except (ConfigError, KeyError, ValueError) as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e).strip("'\""))
            raise AssertionError("unreachable") from e
        return bench_pb2.RooflineResponse(
            report_json=json.dumps(doc),
            ridge=hw.ridge,
            prefill_projection_oi=doc["projection_oi"]["prefill"],
            decode_projection_oi=doc["projection_oi"]["decode"],
            max_concurrency=doc["capacity"]["max_concurrency"],
        )


class BenchService(Service):
    name = "bench"
    summary = "AgentPerfBench: agentic workload profiles, saturation sweeps, roofline"
    capabilities = ("status", "profiles", "roofline", "run", "sweep")

    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        bench_pb2_grpc.add_BenchServiceServicer_to_server(_Servicer(self, ctx), server)
        return (bench_pb2.DESCRIPTOR.services_by_name["BenchService"].full_name,)
