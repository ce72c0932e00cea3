"""The real gateway over a real event log, with a scripted engine behind it; the harness talks to the gateway."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

import pytest

from opengyre.asgi import HttpServer
from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded
from opengyre.proxy import Gateway, GatewayConfig
from opengyre.trajectory import resolve_calls

from ._scripted_engine import ScriptedEngine


@dataclass
class Stack:
    gateway: Gateway
    engine: ScriptedEngine
    log: EventLog
    engine_url: str = ""  # the engine behind the gateway (a harness must not reach it but through the proxy)

    async def recorded(self, execution_id: str) -> list[ModelCallRecorded]:
        """What the proxy recorded for the execution, read back from the log with the payloads joined in."""
        await self.gateway.recorder.flush()
        events = [e async for _, e in self.log.events(ModelCallRecorded) if e.execution_id == execution_id]
        return await resolve_calls(self.log, events)


@pytest.fixture
async def make_stack(event_log: EventLog) -> AsyncIterator[Callable[..., Awaitable[Stack]]]:
    started: list[tuple[Gateway, HttpServer]] = []

    async def make(replies: list[str], **config: object) -> Stack:
        engine = ScriptedEngine(replies)
        srv = HttpServer(engine.app)
        await srv.start()
        gw = Gateway(GatewayConfig(**config), event_log=event_log)  # type: ignore[arg-type]
        await gw.start()
        started.append((gw, srv))
        await gw.pool.add("scripted", srv.url)
        return Stack(gw, engine, event_log, srv.url)

    yield make
    for gw, srv in started:
        await gw.stop()
        await srv.stop()
