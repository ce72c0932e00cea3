"""The elastic policy carried out live, end to end, with real processes: the scheduler (auto mode, local
actuator) turns cells between a real CPU engine and a trainer worker as executions run through the real proxy.
The test plays the two roles outside the scheduler: the rollout driver (dispatches what the scheduler advises,
runs each execution as a harness call through the proxy) and the trainer (publishes a step once its last
micro-step is done)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import openai
import pytest

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import (
    CellRoleChanged,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TrainingStepCompleted,
)
from opengyre.proxy import GatewayConfig
from opengyre.proxy.service import ProxyService
from opengyre.runtime import EmbeddedNats, grpc_channel
from opengyre.scheduler import LoopConfig, SchedulerState
from opengyre.scheduler.actuators import DEFAULT_TRAINER_ARGV, LocalActuator, ProxyDrainer
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService
from opengyre.trajectory import resolve_calls
from opengyre.v1 import proxy_pb2, proxy_pb2_grpc
from opengyre.v1 import scheduler_pb2 as pb

from .._polling import await_until
from ._service import TOKEN, TOKEN_ENV, running_scheduler, running_service

TOKENS = 200
STEPS = 3
LOOP = LoopConfig(steps=STEPS, groups_per_step=2, group_size=2, max_lag=0)


async def _execution(pstub: proxy_pb2_grpc.ProxyServiceStub, event_log: EventLog, xid: str) -> str | None:
    access = await pstub.OpenExecution(proxy_pb2.OpenExecutionRequest(execution_id=xid))
    client = openai.AsyncOpenAI(base_url=access.base_url, api_key=access.api_key, max_retries=0)
    r = await client.chat.completions.create(
        model="opengyre-tiny", messages=[{"role": "user", "content": xid}], max_tokens=TOKENS,
        extra_body={"ignore_eos": True},
    )  # fmt: skip
    await event_log.append(ExecutionFinished(execution_id=xid, status="completed", score=1.0))
    return r.choices[0].finish_reason


@pytest.mark.slow  # real engine and trainer processes through three steps (about 40 s)
async def test_elastic_cells_move_live_and_every_execution_completes(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    proxy = ProxyService(GatewayConfig(port=0))
    async with running_service(proxy, nats_server, log_config, tmp_path / "proxy") as proxy_port:
        proxy_addr = f"127.0.0.1:{proxy_port}"
        actuator = LocalActuator(
            tmp_path / "cells", drainer=ProxyDrainer(proxy_addr, token=TOKEN),
            trainer_argv=[*DEFAULT_TRAINER_ARGV, "--micro-step-s", "0.2"], env=TOKEN_ENV,
        )  # fmt: skip
        svc = SchedulerService(policy=make_policy("elastic"), loop=LOOP, actuator=actuator, auto=True, poll_s=0.1)
        async with (
            running_scheduler(svc, nats_server, log_config, tmp_path / "sched") as (stub, port),
            grpc_channel(proxy_addr, TOKEN) as pch,
        ):
            actuator.scheduler_addr = f"127.0.0.1:{port}"
            pstub = proxy_pb2_grpc.ProxyServiceStub(pch)
            ctl = svc.controller
            assert ctl is not None
            for c in ("c0", "c1"):
                await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=2, role="idle"))
                await stub.ForceRole(pb.ForceRoleRequest(cell_id=c, target="rollout"))
            runs: list[asyncio.Task[str | None]] = []
            started: set[int] = set()
            published = 0
            # A bounded number of polls, not a clock (tests/_polling.py): a loaded machine is slow, not wrong.
            for _ in range(2400):
                st = await stub.GetState(pb.GetStateRequest())
                for d in st.dispatch:  # the rollout driver follows the scheduler's advice, once per step
                    if d.step in started:
                        continue
                    started.add(d.step)
                    for g in range(d.groups):
                        for k in range(LOOP.group_size):
                            xid = f"s{d.step}g{g}e{k}"
                            await event_log.append(ExecutionDispatched(
                                execution_id=xid, task_id="t", group_id=f"s{d.step}g{g}", step=d.step,
                                weight_version=f"v{st.trained_step}", group_size=LOOP.group_size))  # fmt: skip
                            runs.append(asyncio.create_task(_execution(pstub, event_log, xid)))
                if ctl.packer.is_complete and ctl.packer.step == published + 1:
                    # The trainer: the step's last micro-step is done, so it publishes the step.
                    ids = ctl._execution_ids(ctl.packer.groups())
                    published += 1
                    await event_log.append(TrainingStepCompleted(
                        step=published, weight_version=f"v{published}", loss=0.0, n_samples=len(ids),
                        n_tokens=0, execution_ids=list(ids)))  # fmt: skip
                if published == STEPS:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError(f"{published} of {STEPS} steps published after 2400 polls")
            assert await asyncio.gather(*runs) == ["length"] * (STEPS * 4)

            async def folded_last_step() -> bool:  # the scheduler applies the appended step asynchronously
                return (await stub.GetState(pb.GetStateRequest())).trained_step == STEPS

            await await_until(folded_last_step, "the scheduler applied the last published step")
            final = await stub.GetState(pb.GetStateRequest())
            assert final.trained_step == STEPS and final.staleness_max == 0 and final.watermark == 0
        await actuator.close()

    # Replay the log: cells went both ways, never against the watermark, and every call has its full record.
    state, moves, calls = SchedulerState(), [], []
    last = await event_log.last_seq()
    async for batch in event_log.read_batches(1, last):
        for s in await event_log.to_stored_many(batch):
            e = event_log.decode(s)
            if isinstance(e, CellRoleChanged):
                if e.to_role == "draining":
                    assert state.watermark <= state.rollout_capacity - state.cells[e.cell_id].capacity
                moves.append((e.from_role, e.to_role))
            if isinstance(e, ModelCallRecorded):
                calls.append(e)
            state.apply(e, s.seq)
    assert ("switching", "training-core") in moves and ("switching", "rollout") in moves
    calls = await resolve_calls(event_log, calls)  # the tokens, stored once out of the events
    assert len(calls) == STEPS * 4 and all(len(c.output_ids) == TOKENS == len(c.output_logprobs) for c in calls)
