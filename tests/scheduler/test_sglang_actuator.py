"""The GPU actuator against a stand-in SGLang server speaking SGLang's real admin routes (no GPU here): a switch
releases and resumes the engine's memory, loads the newest weights, and starts a trainer worker from the argv
template; every step lands in order."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route

from opengyre.events import CellRegistered, CellRoleChanged
from opengyre.scheduler import SchedulerState
from opengyre.scheduler._actuation import RoleChanger
from opengyre.scheduler.actuators import SglangMegatronActuator

from .._polling import await_until


def _fake_sglang(calls: list[tuple[str, dict[str, object]]]) -> Starlette:
    """Only the routes the actuator uses, with SGLang's request and response shapes."""

    async def release(request: Request) -> JSONResponse:
        calls.append(("release_memory_occupation", await request.json()))
        return JSONResponse({"success": True, "message": "released"})

    async def resume(request: Request) -> JSONResponse:
        calls.append(("resume_memory_occupation", await request.json()))
        return JSONResponse({"success": True, "message": "resumed"})

    async def update(request: Request) -> JSONResponse:
        body = await request.json()
        calls.append(("update_weights_from_disk", body))
        if "model_path" not in body:
            return JSONResponse({"success": False, "message": "model_path is required"}, status_code=400)
        return JSONResponse({"success": True, "message": "ok", "num_paused_requests": 0})

    async def health_generate(request: Request) -> PlainTextResponse:
        calls.append(("health_generate", {}))
        return PlainTextResponse("")

    return Starlette(
        routes=[
            Route("/release_memory_occupation", release, methods=["POST"]),
            Route("/resume_memory_occupation", resume, methods=["POST"]),
            Route("/update_weights_from_disk", update, methods=["POST"]),
            Route("/health_generate", health_generate, methods=["GET"]),
        ]
    )


@pytest.fixture
async def sglang() -> AsyncIterator[tuple[str, list[tuple[str, dict[str, object]]]]]:
    calls: list[tuple[str, dict[str, object]]] = []
    # A socket bound here, handed to the server: no gap in which another xdist worker could take its port.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    server = uvicorn.Server(uvicorn.Config(_fake_sglang(calls), log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    await await_until(lambda: server.started, "the server started", polls=6000, every=0.02)
    yield f"http://127.0.0.1:{port}", calls
    server.should_exit = True
    await task
    sock.close()


async def test_switches_release_resume_reload_and_launch_the_trainer(
    sglang: tuple[str, list[tuple[str, dict[str, object]]]], tmp_path: Path
) -> None:
    url, calls = sglang
    # A launcher stand-in: where production would srun/torchrun onto the cell's nodes, write the ready file.
    launcher = [sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w').write('ready'); time.sleep(60)",
                "{ready_file}", "{cell}", "{node}", "{gpus}", "{role}"]  # fmt: skip

    async def latest() -> tuple[str, str]:
        return "/ckpt/step-7", "v7"

    actuator = SglangMegatronActuator(
        tmp_path, trainer_argv=launcher, scheduler_addr="sched:50052", latest_weights=latest, ready_timeout_s=30
    )
    state = SchedulerState()
    state.apply(CellRegistered(cell_id="c0", node="node-0", gpus=32, capacity=64, engine_url=url))
    state.apply(CellRegistered(cell_id="c1", node="node-4", gpus=32, capacity=64, engine_url=url))
    log: list[CellRoleChanged] = []

    async def append(e: CellRoleChanged) -> int:
        state.apply(e)
        log.append(e)
        return len(log)

    async def current() -> SchedulerState:
        return state

    changer = RoleChanger(actuator, append, current)
    await changer.to_training(state.cells["c0"], "test")
    assert [c for c, _ in calls] == ["release_memory_occupation"]
    trainer = actuator.trainers["c0"]
    assert trainer.alive and trainer.argv[-4:] == ["c0", "node-0", "32", "core"]
    await changer.to_rollout(state.cells["c0"], "burst")
    assert not trainer.alive and "c0" not in actuator.trainers
    assert [c for c, _ in calls] == [
        "release_memory_occupation",
        "resume_memory_occupation",
        "update_weights_from_disk",
        "health_generate",
    ]
    assert calls[2][1] == {"model_path": "/ckpt/step-7", "weight_version": "v7"}
    assert [(e.from_role, e.to_role) for e in log] == [
        ("rollout", "draining"),
        ("draining", "switching"),
        ("switching", "training-core"),
        ("training-core", "switching"),
        ("switching", "rollout"),
    ]
    assert log[-1].engine_url == url
    await actuator.close()
