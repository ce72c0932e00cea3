"""SchedulerService over gRPC: registration, state, the change stream, forced roles and drains; bad commands are
refused with a precise status and change nothing."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest

from opengyre.config import Settings
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CellRoleChanged, ExecutionDispatched, ExecutionFinished, TrainingStepCompleted
from opengyre.runtime import EmbeddedNats
from opengyre.scheduler import LoopConfig, SchedulerState
from opengyre.scheduler.actuators import ExternalActuator, LocalActuator, ProxyDrainer
from opengyre.scheduler.policies import make_policy
from opengyre.scheduler.service import SchedulerService, proxy_address
from opengyre.scheduler.worker import run_worker
from opengyre.v1 import scheduler_pb2 as pb

from .._polling import await_until
from ._service import TOKEN, running_scheduler


async def _code(call: object) -> grpc.StatusCode:
    try:
        await call  # type: ignore[misc]
    except grpc.aio.AioRpcError as exc:
        return exc.code()
    raise AssertionError("the call was not refused")


async def _log_types(event_log: EventLog) -> list[str]:
    return [m.type_name async for m in _stored(event_log)]


async def _stored(event_log: EventLog):  # type: ignore[no-untyped-def]
    last = await event_log.last_seq()
    if last:
        async for batch in event_log.read_batches(1, last):
            for s in await event_log.to_stored_many(batch):
                yield s


async def test_bad_commands_are_refused_and_change_nothing(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    svc = SchedulerService(
        policy=make_policy("elastic"), loop=LoopConfig(groups_per_step=1, group_size=2), actuator=ExternalActuator()
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        await stub.RegisterCell(pb.RegisterCellRequest(cell_id="c0", gpus=8, capacity=2))
        await event_log.append(ExecutionDispatched(execution_id="x0", task_id="t", group_id="g0", group_size=1))
        await svc.controller.wait_applied(await event_log.last_seq())  # type: ignore[union-attr]
        before = await stub.GetState(pb.GetStateRequest())
        n_events = await event_log.last_seq()

        bad = [
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="c0", capacity=2)), grpc.StatusCode.ALREADY_EXISTS),
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="bad.id", capacity=2)), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="c9", capacity=0)), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="c" * 65, capacity=2)), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="c9", capacity=2, engine_url="http://" + "e" * 250)),
             grpc.StatusCode.INVALID_ARGUMENT),
            (stub.RegisterCell(pb.RegisterCellRequest(cell_id="c9", role="training-core")),
             grpc.StatusCode.INVALID_ARGUMENT),
            (stub.ForceRole(pb.ForceRoleRequest(cell_id="nope", target="training")), grpc.StatusCode.NOT_FOUND),
            (stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="sideways")), grpc.StatusCode.INVALID_ARGUMENT),
            # The last rollout cell with an execution live cannot go to training.
            (stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="training")), grpc.StatusCode.FAILED_PRECONDITION),
            (stub.DrainCell(pb.DrainCellRequest(cell_id="c0")), grpc.StatusCode.FAILED_PRECONDITION),
            (stub.DrainCell(pb.DrainCellRequest(cell_id="nope")), grpc.StatusCode.NOT_FOUND),
            (stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="rollout")), grpc.StatusCode.FAILED_PRECONDITION),
            (stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c0")), grpc.StatusCode.FAILED_PRECONDITION),
            (stub.CompleteMicroStep(pb.CompleteMicroStepRequest(cell_id="c0", step=1)),
             grpc.StatusCode.FAILED_PRECONDITION),
        ]  # fmt: skip
        for call, code in bad:
            assert await _code(call) == code
        assert await event_log.last_seq() == n_events  # nothing was appended
        after = await stub.GetState(pb.GetStateRequest())
        assert after.cells == before.cells and after.watermark == before.watermark == 1


async def test_role_switch_protocol_state_stream_and_micro_steps(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    loop = LoopConfig(groups_per_step=2, group_size=2)
    svc = SchedulerService(policy=make_policy("elastic"), loop=loop, actuator=ExternalActuator(), poll_s=0.05)
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        watch = stub.WatchState(pb.WatchStateRequest())
        first = await watch.read()
        assert first.policy == "elastic" and not first.cells
        for i in range(2):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=f"c{i}", gpus=8, capacity=4))
        seen = await watch.read()
        while len(seen.cells) < 2:
            seen = await watch.read()
        assert seen.rollout_capacity == 8
        # Two groups of two: the policy allows dispatching step 1 and 2 (lag 1).
        assert [d.step for d in seen.dispatch] == [1, 2]
        for g in range(2):
            for k in range(2):
                await event_log.append(
                    ExecutionDispatched(execution_id=f"x{g}{k}", task_id="t", group_id=f"g{g}", step=1, group_size=2)
                )
        # w = 4 <= CR - Ce = 4: c1 may go to training even with executions live; they fit on c0.
        out = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training", reason="test"))
        assert out.cell.role == "training-core"
        assert list(out.steps) == ["c1: rollout->draining", "c1: draining->switching", "c1: switching->training-core"]
        # c0 is now the last rollout cell, with 4 live: refused.
        assert await _code(stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="training"))) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        assert not (await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))).claimed  # nothing ready
        for x in ("x00", "x01", "x10", "x11"):
            await event_log.append(ExecutionFinished(execution_id=x, status="completed", score=1.0))
        await svc.controller.wait_applied(await event_log.last_seq())  # type: ignore[union-attr]
        a = await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))
        again = await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))
        assert a.claimed and again.index == a.index  # a restarted worker gets its own micro-step back
        assert sorted(a.execution_ids) in (["x00", "x01"], ["x10", "x11"])
        r1 = await stub.CompleteMicroStep(pb.CompleteMicroStepRequest(cell_id="c1", step=a.step, index=a.index))
        assert not r1.step_complete
        b = await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))
        r2 = await stub.CompleteMicroStep(pb.CompleteMicroStepRequest(cell_id="c1", step=b.step, index=b.index))
        assert r2.step_complete and sorted(r2.execution_ids) == ["x00", "x01", "x10", "x11"]
        await event_log.append(
            TrainingStepCompleted(step=1, weight_version="v1", loss=0.0, n_samples=4, n_tokens=0,
                                  execution_ids=list(r2.execution_ids))
        )  # fmt: skip
        back = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="rollout"))
        assert back.cell.role == "rollout"
        st = await stub.GetState(pb.GetStateRequest())
        assert st.trained_step == 1 and st.staleness_max == 0 and st.rollout_capacity == 8
        drained = await stub.DrainCell(pb.DrainCellRequest(cell_id="c0", reason="maintenance"))
        assert drained.cell.role == "idle"
        watch.cancel()
    roles = []
    async for s in _stored(event_log):
        e = event_log.decode(s)
        if isinstance(e, CellRoleChanged):
            roles.append((e.cell_id, e.from_role, e.to_role))
    assert roles == [
        ("c1", "rollout", "draining"),
        ("c1", "draining", "switching"),
        ("c1", "switching", "training-core"),
        ("c1", "training-core", "switching"),
        ("c1", "switching", "rollout"),
        ("c0", "rollout", "draining"),
        ("c0", "draining", "idle"),
    ]


@pytest.mark.parametrize("name", ["elastic"])
async def test_auto_mode_carries_out_the_policy(
    name: str, nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    loop = LoopConfig(steps=1, groups_per_step=1, group_size=2)
    svc = SchedulerService(policy=make_policy(name), loop=loop, actuator=ExternalActuator(), auto=True, poll_s=0.05)
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for i in range(2):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=f"c{i}", gpus=8, capacity=2))
        for k in range(2):
            await event_log.append(
                ExecutionDispatched(execution_id=f"x{k}", task_id="t", group_id="g", step=1, group_size=2)
            )
        for k in range(2):
            await event_log.append(ExecutionFinished(execution_id=f"x{k}", status="completed", score=1.0))
        # Ready data and w = 0: the policy turns c0 to training (growing prefix), by itself.
        watch = stub.WatchState(pb.WatchStateRequest())
        roles: dict[str, str] = {}
        async with asyncio.timeout(30):
            async for view in watch:
                roles = {c.cell_id: c.role for c in view.cells}
                if roles.get("c0") == "training-core":
                    break
        watch.cancel()
        # One cell at a time, and only while ready data keeps up: one ready micro-step feeds one cell, so c1 stays.
        assert roles == {"c0": "training-core", "c1": "rollout"}


async def test_a_switch_that_stops_half_way_is_resumed_or_undone(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    # No proxy answers: the drain cannot be confirmed, so the protocol stops in "draining" (nothing released).
    dead_proxy = ProxyDrainer("127.0.0.1:1", token=None, timeout_s=5)
    svc = SchedulerService(policy=make_policy("elastic"), actuator=ExternalActuator(dead_proxy))
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for c in ("c0", "c1"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=4))
        code = await _code(stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training")))
        assert code == grpc.StatusCode.UNAVAILABLE
        st = await stub.GetState(pb.GetStateRequest())
        assert {c.cell_id: c.role for c in st.cells} == {"c0": "rollout", "c1": "draining"}
        assert st.rollout_capacity == 4  # out of CR already, never released
        # Undo: the drain is cancelled and the cell serves again.
        back = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="rollout", reason="cancel drain"))
        assert back.cell.role == "rollout" and list(back.steps) == ["c1: draining->rollout"]
        # Stuck again; then the proxy question goes away (no proxy in front of these cells) and the same
        # command resumes the switch from where it stopped.
        code = await _code(stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training")))
        assert code == grpc.StatusCode.UNAVAILABLE
        assert svc.controller is not None
        svc.controller.actuator = ExternalActuator()
        done = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training"))
        assert done.cell.role == "training-core"
        assert list(done.steps) == ["c1: draining->switching", "c1: switching->training-core"]


async def test_a_cell_leaving_training_gives_back_its_micro_step_even_to_a_worker_still_claiming(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    loop = LoopConfig(groups_per_step=2, group_size=1)
    svc = SchedulerService(policy=make_policy("elastic"), loop=loop, actuator=ExternalActuator())
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for c in ("c0", "c1"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=4))
        await event_log.append(ExecutionDispatched(execution_id="x0", task_id="t", group_id="g0", step=1, group_size=1))
        await event_log.append(ExecutionFinished(execution_id="x0", status="completed", score=1.0))
        await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training"))
        assert (await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))).claimed

        # c1's worker keeps claiming, as a real one does until it is stopped, while c1 goes back to rollout.
        leaving = asyncio.ensure_future(stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="rollout")))
        while not leaving.done():
            with contextlib.suppress(grpc.aio.AioRpcError):  # refused once c1 is no longer training
                await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c1"))
        assert (await leaving).cell.role == "rollout"

        # The micro-step c1 held is back in the buffer: the next training cell gets it.
        await stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="training"))
        again = await stub.ClaimMicroStep(pb.ClaimMicroStepRequest(cell_id="c0"))
        assert again.claimed and list(again.execution_ids) == ["x0"]


async def test_a_pool_moving_at_once_has_one_core_and_all_of_it_comes_back(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    # Colocate asks for the whole pool at once and the controller carries the requests out concurrently; the
    # cells' processes take a moment to come up, as real ones do (stand-ins: only the start-up matters here).
    up = "import sys, time; time.sleep(0.3); open(sys.argv[1], 'w').write(sys.argv[2]); time.sleep(120)"
    actuator = LocalActuator(
        tmp_path / "cells", engine_argv=[sys.executable, "-c", up, "{ready_file}", "http://127.0.0.1:9"],
        trainer_argv=[sys.executable, "-c", up, "{ready_file}", "ready"],
    )  # fmt: skip
    loop = LoopConfig(steps=2, groups_per_step=1, group_size=1)
    svc = SchedulerService(policy=make_policy("colocate"), loop=loop, actuator=actuator, auto=True, poll_s=0.05)
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for c in ("c0", "c1", "c2"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=2))

        async def roles_become(want: set[str]) -> list[str]:
            async with asyncio.timeout(60):
                while True:
                    roles = [c.role for c in (await stub.GetState(pb.GetStateRequest())).cells]
                    if set(roles) <= want:
                        return roles
                    await asyncio.sleep(0.05)

        await event_log.append(ExecutionDispatched(execution_id="x0", task_id="t", group_id="g0", step=1, group_size=1))
        await event_log.append(ExecutionFinished(execution_id="x0", status="completed", score=1.0))
        roles = await roles_become({"training-core", "training-satellite"})
        assert sorted(roles) == ["training-core", "training-satellite", "training-satellite"]
        await event_log.append(
            TrainingStepCompleted(step=1, weight_version="v1", loss=0.0, n_samples=1, n_tokens=0, execution_ids=["x0"])
        )
        assert await roles_become({"rollout"}) == ["rollout"] * 3
    await actuator.close()
    # Every protocol step the controller appended was a legal one (none dead-lettered on a stale role).
    replay = SchedulerState()
    async for s in _stored(event_log):
        replay.apply(event_log.decode(s), s.seq)


async def test_an_invalid_loop_from_the_environment_stops_the_start(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENGYRE_SCHEDULER_GROUPS_PER_STEP", "0")
    svc = SchedulerService(policy=make_policy("elastic"), actuator=ExternalActuator())
    with pytest.raises(ValueError, match="invalid loop config"):
        async with running_scheduler(svc, nats_server, log_config, tmp_path):
            pass


async def test_a_worker_outlives_a_scheduler_restart_mid_micro_step(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    """The restarted scheduler no longer knows the worker's claim: the worker's report is refused, and the worker
    goes on claiming (the micro-step is handed out again) instead of dying with its cell left in training."""
    loop = LoopConfig(groups_per_step=2, group_size=1)
    entered, go_on = threading.Event(), threading.Event()
    trained: list[tuple[int, list[str]]] = []

    def train(step: int, execution_ids: Sequence[str]) -> None:
        entered.set()
        go_on.wait(60)
        trained.append((step, list(execution_ids)))

    def scheduler() -> SchedulerService:
        return SchedulerService(policy=make_policy("elastic"), loop=loop, actuator=ExternalActuator(), poll_s=0.05)

    stop = asyncio.Event()
    # The first run binds any free port; the restart takes that one again (the worker knows only the address).
    async with running_scheduler(scheduler(), nats_server, log_config, tmp_path) as (stub, port):
        for c in ("c0", "c1"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=4))
        for g in range(2):
            await event_log.append(ExecutionDispatched(execution_id=f"x{g}", task_id="t", group_id=f"g{g}", step=1,
                                                       group_size=1))  # fmt: skip
            await event_log.append(ExecutionFinished(execution_id=f"x{g}", status="completed", score=1.0))
        await stub.ForceRole(pb.ForceRoleRequest(cell_id="c1", target="training"))
        worker = asyncio.create_task(
            run_worker("c1", f"127.0.0.1:{port}", token=TOKEN, stop=stop, train=train, poll_s=0.05)
        )
        await await_until(entered.is_set, "the worker entered its micro-step", polls=6000, every=0.02)
    svc = scheduler()
    async with running_scheduler(svc, nats_server, log_config, tmp_path, port=port):
        go_on.set()
        assert svc.controller is not None
        controller = svc.controller

        def step_one_complete() -> bool:
            assert not worker.done(), worker.exception()  # the worker must outlive the restart
            return controller.packer.is_complete

        # Both micro-steps of step 1, from the restarted scheduler.
        await await_until(step_one_complete, "the restarted scheduler completed step 1", polls=2400, every=0.05)
        stop.set()
        assert await worker == 2
    assert sorted(x for _, ids in trained for x in ids) == ["x0", "x0", "x1"]  # x0's micro-step was redone


@pytest.mark.parametrize(("host", "dial"), [("0.0.0.0", "127.0.0.1"), ("::", "127.0.0.1"), ("10.1.2.3", "10.1.2.3")])
def test_the_default_proxy_address_is_one_to_dial_not_a_wildcard_bind(host: str, dial: str) -> None:
    """A stack bound to 0.0.0.0 (containers) listens on every interface; the proxy is dialled on loopback,
    or at OPENGYRE_SCHEDULER_PROXY_ADDR (docker-compose.yml sets the proxy's service address)."""
    settings = Settings(host=host)
    assert proxy_address(settings, {}) == f"{dial}:{settings.ports['proxy']}"
    assert proxy_address(settings, {"OPENGYRE_SCHEDULER_PROXY_ADDR": "proxy:50053"}) == "proxy:50053"


async def test_a_cell_moves_to_a_new_engine_keeping_its_role_and_then_changes_role_as_before(
    nats_server: EmbeddedNats, log_config: LogConfig, event_log: EventLog, tmp_path: Path
) -> None:
    svc = SchedulerService(
        policy=make_policy("elastic"), loop=LoopConfig(groups_per_step=1, group_size=2), actuator=ExternalActuator()
    )
    async with running_scheduler(svc, nats_server, log_config, tmp_path) as (stub, _):
        for c in ("c0", "c1"):
            await stub.RegisterCell(pb.RegisterCellRequest(cell_id=c, capacity=2, engine_url=f"http://old-{c}"))
        n = await event_log.last_seq()
        bad = [
            (stub.SetCellEngine(pb.SetCellEngineRequest(cell_id="nope", engine_url="http://x")), grpc.StatusCode.NOT_FOUND),
            (stub.SetCellEngine(pb.SetCellEngineRequest(cell_id="c0")), grpc.StatusCode.INVALID_ARGUMENT),
            (stub.SetCellEngine(pb.SetCellEngineRequest(cell_id="c0", engine_url="http://" + "e" * 250)),
             grpc.StatusCode.INVALID_ARGUMENT),
        ]  # fmt: skip
        for call, code in bad:
            assert await _code(call) == code
        assert await event_log.last_seq() == n
        moved = await stub.SetCellEngine(pb.SetCellEngineRequest(cell_id="c0", engine_url="http://new-c0", reason="r"))
        assert (moved.engine_url, moved.role) == ("http://new-c0", "rollout")
        again = await stub.SetCellEngine(pb.SetCellEngineRequest(cell_id="c0", engine_url="http://new-c0"))
        assert again.engine_url == "http://new-c0"
        assert (await _log_types(event_log))[-1] == "cell-engine-changed"
        assert await event_log.last_seq() == n + 1  # the same URL again appends nothing
        st = await stub.GetState(pb.GetStateRequest())
        assert {c.cell_id: c.engine_url for c in st.cells} == {"c0": "http://new-c0", "c1": "http://old-c1"}
        # The cell's next role change appends after the engine change (its stream position moved with it).
        done = await stub.ForceRole(pb.ForceRoleRequest(cell_id="c0", target="training"))
        assert done.cell.role.startswith("training") and done.cell.engine_url == "http://new-c0"
    # A scheduler started again rebuilds the same cells from the log.
    fresh = SchedulerService(
        policy=make_policy("elastic"), loop=LoopConfig(groups_per_step=1, group_size=2), actuator=ExternalActuator()
    )
    (tmp_path / "again").mkdir()
    async with running_scheduler(fresh, nats_server, log_config, tmp_path / "again") as (stub, _):
        await fresh.controller.wait_applied(await event_log.last_seq())  # type: ignore[union-attr]
        st = await stub.GetState(pb.GetStateRequest())
        assert {c.cell_id: c.engine_url for c in st.cells} == {"c0": "http://new-c0", "c1": "http://old-c1"}
