"""A judge behind the real gateway, a scripted engine behind that: what the judge tests share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass

from opengyre.asgi import HttpServer
from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded
from opengyre.grading import HarborVerifier, JudgeConfig, JudgedVerifier, LLMJudge
from opengyre.proxy import Gateway, GatewayConfig
from tests.libs.harness._scripted_engine import ScriptedEngine

__all__ = ["Judge", "judging"]


@dataclass
class Judge:
    engine: ScriptedEngine
    gateway: Gateway
    log: EventLog
    execution_id: str

    def verifier(self, **config: object) -> JudgedVerifier:
        cfg = JudgeConfig(
            base_url=self.gateway.base_url(self.execution_id),
            model="opengyre-tiny",
            api_key=self.gateway.issue_key(self.execution_id),
            **config,  # type: ignore[arg-type]
        )
        return JudgedVerifier(HarborVerifier(), LLMJudge(cfg))

    async def recorded(self) -> list[ModelCallRecorded]:
        await self.gateway.recorder.flush()
        return [e async for _, e in self.log.events(ModelCallRecorded) if e.execution_id == self.execution_id]


@contextlib.asynccontextmanager
async def judging(event_log: EventLog) -> AsyncIterator[Judge]:
    engine = ScriptedEngine([])
    srv = HttpServer(engine.app)
    await srv.start()
    gw = Gateway(GatewayConfig(), event_log=event_log)
    await gw.start()
    await gw.pool.add("scripted", srv.url)
    try:
        yield Judge(engine, gw, event_log, "judge-of-e1")
    finally:
        await gw.stop()
        await srv.stop()
