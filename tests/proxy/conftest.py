"""Proxy fixtures: real CPU engines in this process, a gateway over a real event log, a tool-using policy."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import openai
import pytest

from opengyre.engine import EngineConfig, EngineServer, RequestRecord
from opengyre.eventlog import EventLog
from opengyre.events import ModelCallRecorded, TrajectoryRole
from opengyre.proxy import Gateway, GatewayConfig
from opengyre.trajectory import TrajectoryTree, resolve_calls

from .._engines import engine_a, engine_b, one_torch_thread
from ._policy import train_tool_policy

__all__ = ["Stack", "engine_a", "engine_b", "make_stack", "one_torch_thread"]


@pytest.fixture(scope="session")
def tool_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint of the tiny model trained to call ``bash`` in the scripted conversation (_policy.py)."""
    return train_tool_policy(tmp_path_factory.mktemp("tool-policy"))


@dataclass
class Stack:
    gateway: Gateway
    log: EventLog
    engines: dict[str, EngineServer]

    def openai(self, execution_id: str, role: TrajectoryRole = "main", **kw: object) -> openai.AsyncOpenAI:
        key = self.gateway.issue_key(execution_id, role)
        return openai.AsyncOpenAI(base_url=self.gateway.base_url(execution_id), api_key=key, max_retries=0, **kw)  # type: ignore[arg-type]

    def anthropic(self, execution_id: str, role: TrajectoryRole = "main", **kw: object) -> anthropic.AsyncAnthropic:
        key = self.gateway.issue_key(execution_id, role)
        return anthropic.AsyncAnthropic(
            base_url=f"{self.gateway.url}/x/{execution_id}",
            api_key=key,
            max_retries=0,
            **kw,  # type: ignore[arg-type]
        )

    async def recorded_as_stored(self) -> list[ModelCallRecorded]:
        """The recorded events as the log holds them (tokens and context in the payload store)."""
        await self.gateway.recorder.flush()
        out = []
        async for s in self.log.read():
            if s.type_name == "model-call-recorded":
                e = self.log.decode(s)
                assert isinstance(e, ModelCallRecorded)
                out.append(e)
        return out

    async def recorded(self) -> list[ModelCallRecorded]:
        """The recorded events with their payloads joined back in (what each call recorded, whole)."""
        return await resolve_calls(self.log, await self.recorded_as_stored())

    def engine_records(self, call_id: str) -> list[RequestRecord]:
        """Every request the engines ran for one call, in attempt order (rid ``<call_id>-<attempt>``)."""
        recs = [r for srv in self.engines.values() for r in srv.engine.request_log(f"{call_id}-")]
        return sorted(recs, key=lambda r: int(r.rid.rsplit("-", 1)[1]))

    async def assert_recorded_matches_engines(self) -> list[ModelCallRecorded]:
        """The TITO guarantee: recorded prompt and output ids are what the engines consumed and produced."""
        events = await self.recorded()
        assert events, "nothing was recorded: the check would prove nothing"
        trees: dict[str, TrajectoryTree] = {}
        for e in events:
            tree = trees.setdefault(e.execution_id, TrajectoryTree(e.execution_id))
            tree.add(e)
            prompt = list(tree.prompt(e.call_id))
            recs = self.engine_records(e.call_id)
            assert len(recs) == e.attempts, (e.call_id, len(recs), e.attempts)
            produced: list[int] = []
            logprobs: list[float] = []
            for r in recs:
                assert list(r.input_ids) == prompt + produced, e.call_id
                produced += list(r.output_ids)
                logprobs += list(r.output_logprobs)
            assert produced == list(e.output_ids), e.call_id
            assert logprobs == list(e.output_logprobs), e.call_id
        return events


async def make_stack(event_log: EventLog, engines: dict[str, EngineServer], **config: object) -> Stack:
    gw = Gateway(GatewayConfig(**config), event_log=event_log)  # type: ignore[arg-type]
    await gw.start()
    for name, srv in engines.items():
        await gw.pool.add(name, srv.url)
    return Stack(gw, event_log, engines)


@pytest.fixture
async def stack(event_log: EventLog, engine_a: EngineServer) -> AsyncIterator[Stack]:
    s = await make_stack(event_log, {"e0": engine_a})
    yield s
    await s.gateway.stop()


@pytest.fixture
async def tool_stack(event_log: EventLog, tool_policy: Path) -> AsyncIterator[Stack]:
    async with EngineServer(EngineConfig(port=0, checkpoint=tool_policy)) as srv:
        s = await make_stack(event_log, {"tool": srv})
        yield s
        await s.gateway.stop()
