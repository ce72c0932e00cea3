"""A role switch never loses or kills a live execution: with the real proxy (gateway, cell watcher, drain) and
real CPU engine processes started by the local actuator, executions in flight on a cell that turns to training
finish on another cell with their full token record."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.proxy import GatewayConfig
from opengyre.proxy.service import ProxyService
from opengyre.runtime import EmbeddedNats, grpc_channel
from opengyre.scheduler import LoopConfig
from opengyre.scheduler.actuators import LocalActuator, ProxyDrainer
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.trajectory import resolve_calls
from opengyre.v1 import proxy_pb2, proxy_pb2_grpc
from opengyre.v1 import scheduler_pb2 as pb

from .._polling import await_until
from ._service import TOKEN, TOKEN_ENV, running_scheduler, running_service

LONG = 1500  # tokens: certainly still generating when the switch comes
M = "opengyre-tiny"


async def _harness(access: proxy_pb2.ExecutionAccess, started: asyncio.Event) -> tuple[str | None, int]:
    """A black-box harness: one streamed call through the proxy; it knows nothing of cells."""
    client = openai.AsyncOpenAI(base_url=access.base_url, api_key=access.api_key, max_retries=0)
    stream = await client.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "build the repository"}], max_tokens=LONG, stream=True,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    finish, chunks = None, 0
    async for ch in stream:
        if ch.choices:
            chunks += 1
            finish = ch.choices[0].finish_reason or finish
            if chunks == 5:
                started.set()
    return finish, chunks


async def _recorded(event_log: EventLog, n: int) -> list[ModelCallRecorded]:
    async with asyncio.timeout(60):
        while True:
            out = []
            last = await event_log.last_seq()
            async for batch in event_log.read_batches(1, last):
                for s in await event_log.to_stored_many(batch):
                    if s.type_name == "model-call-recorded":
                        e = event_log.decode(s)
                        assert isinstance(e, ModelCallRecorded)
                        out.append(e)
            if len(out) >= n:
                return await resolve_calls(event_log, out)  # the tokens, stored once out of the events
            await asyncio.sleep(0.1)


async def test_executions_in_flight_across_a_switch_finish_with_their_full_token_record(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    proxy = ProxyService(GatewayConfig(port=0))
    async with running_service(proxy, nats_server, log_config, tmp_path / "proxy") as proxy_port:
        proxy_addr = f"127.0.0.1:{proxy_port}"
        actuator = LocalActuator(tmp_path / "cells", drainer=ProxyDrainer(proxy_addr, token=TOKEN), env=TOKEN_ENV)
        svc = SchedulerService(
            policy=make_policy("elastic"), loop=LoopConfig(groups_per_step=1, group_size=2), actuator=actuator
        )
        async with (
            running_scheduler(svc, nats_server, log_config, tmp_path / "sched") as (stub, port),
            grpc_channel(proxy_addr, TOKEN) as pch,
        ):
            actuator.scheduler_addr = f"127.0.0.1:{port}"
            pstub = proxy_pb2_grpc.ProxyServiceStub(pch)
            for c in ("c0", "c1"):
                await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=4, role="idle"))
                await stub.ForceRole(pb.ForceRoleRequest(cell_id=c, target="rollout"))  # engine process up

            async def both_engines() -> bool:  # the proxy learns both engines from the cell events
                return len((await pstub.ListEngines(proxy_pb2.ListEnginesRequest())).engines) >= 2

            await await_until(both_engines, "the proxy knows both engines", polls=2400, every=0.05)

            started = [asyncio.Event(), asyncio.Event()]
            harnesses = []
            for i in range(2):
                x = f"x{i}"
                await event_log.append(ExecutionDispatched(execution_id=x, task_id="t", group_id="g", step=1,
                                                           group_size=2))  # fmt: skip
                access = await pstub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id=x))
                harnesses.append(asyncio.create_task(_harness(access, started[i])))
            for ev in started:
                await ev.wait()
            engines = (await pstub.ListEngines(proxy_pb2.ListEnginesRequest())).engines
            busy = max(engines, key=lambda e: e.inflight)
            assert busy.inflight >= 1
            engine_pid = actuator.engines[busy.engine_id].pid

            # The busiest cell turns to training while its executions are mid-generation.
            out = await stub.ForceRole(pb.ForceRoleRequest(cell_id=busy.engine_id, target="training"))
            assert out.cell.role == "training-core"
            assert busy.engine_id not in actuator.engines and busy.engine_id in actuator.trainers
            assert engine_pid is not None

            results = await asyncio.gather(*harnesses)
            assert [f for f, _ in results] == ["length", "length"]  # nothing killed, nothing cut short
            calls = await _recorded(event_log, 2)
            assert sorted(c.execution_id for c in calls) == ["x0", "x1"]
            for c in calls:
                assert len(c.output_ids) == LONG == len(c.output_logprobs)  # the full token record
            moved = [c for c in calls if c.attempts > 1]
            assert len(moved) == busy.inflight  # exactly the switched cell's executions were rerouted
            for c in moved:
                assert c.engine_id.split(",")[0] == busy.engine_id
            for i in range(2):
                await event_log.append(ExecutionFinished(execution_id=f"x{i}", status="completed", score=1.0))
            st = await stub.GetState(pb.GetStateRequest())
            assert {c.cell_id: c.role for c in st.cells}[busy.engine_id] == "training-core"
        await actuator.close()
