"""Sealing an execution (ProxyService.SealExecution, what a rollout driver does before scoring): later calls are
refused in each dialect's shape, a call still generating when the seal lands is refused when it would be recorded,
the seal waits until the log holds the execution's held calls and returns their number, and the seal survives a
SIGKILL of the proxy (it is in the outbox file, fsync'd). Once the log holds an execution's sealed finish the outbox
forgets its seal, and the proxy's store keeps refusing its calls."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import anthropic
import openai
import pytest
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from sqlalchemy import Engine

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.projection import ProjectionRunner
from opengyre.proxy import Gateway, GatewayConfig, SealedFinishes, TrajectoryProjection

from .._polling import await_until
from .test_recorder import Nats
from .test_recorder_crash import Proxy

M = "opengyre-tiny"


async def _refusing_log(nats: Nats, name: str) -> tuple[EventLog, StreamConfig]:
    """A log whose stream is full (one event, discard new): every answered call stays in the proxy's outbox."""
    cfg = LogConfig(stream=name, prefix=f"{name.lower()}.ev", blob_bucket=f"{name}B")
    log = await EventLog.connect(nats.url, cfg)  # made with no limit: narrowed below
    stream = StreamConfig(
        name=cfg.stream, subjects=[cfg.all_subjects], storage=StorageType.FILE, max_msgs=1, discard=DiscardPolicy.NEW
    )
    await log.js.update_stream(stream)
    await log.append(ExecutionDispatched(execution_id="first", task_id="t", group_id="g", group_size=1))
    return log, stream


async def _chat_turns(base_url: str, n: int) -> list[str]:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="any", max_retries=0)
    msgs: list[dict[str, object]] = [{"role": "user", "content": "task"}]
    ids = []
    for _ in range(n):
        r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
        ids.append(r.id.removeprefix("chatcmpl-"))
        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
    return ids


async def _recorded(log: EventLog, execution_id: str) -> list[str]:
    return [e.call_id async for _, e in log.events(ModelCallRecorded) if e.execution_id == execution_id]


async def test_a_seal_refuses_later_calls_and_returns_once_the_held_calls_are_in_the_log(
    tmp_path: Path, engine_a: EngineServer
) -> None:
    nats = Nats(tmp_path / "nats")
    log, stream = await _refusing_log(nats, "SEAL")
    gw = Gateway(
        GatewayConfig(require_key=False, outbox_path=str(tmp_path / "outbox.sqlite3"), stop_drain_timeout_s=0.5),
        event_log=log,
    )
    await gw.pool.add("e0", engine_a.url)
    await gw.start()
    try:
        answered = await _chat_turns(gw.base_url("sx"), 2)
        assert gw.recorder.pending == 2
        failures = gw.recorder.send_failures
        seal = asyncio.create_task(gw.seal_execution("sx"))
        await await_until(lambda: gw.recorder.send_failures >= failures + 2, "the drainer retried after the seal")
        assert not seal.done()  # the log still refuses: the held calls are not in it, so no count yet

        with pytest.raises(openai.PermissionDeniedError) as oa:
            await _chat_turns(gw.base_url("sx"), 1)
        assert oa.value.status_code == 403 and oa.value.code == "execution_sealed" and "sealed" in oa.value.message
        claude = anthropic.AsyncAnthropic(base_url=f"{gw.url}/x/sx", api_key="any", max_retries=0)
        with pytest.raises(anthropic.PermissionDeniedError) as an:
            await claude.messages.create(model=M, max_tokens=3, messages=[{"role": "user", "content": "more"}])
        assert isinstance(an.value.body, dict) and an.value.body["type"] == "error"
        assert an.value.body["error"]["type"] == "permission_error"
        with pytest.raises(openai.PermissionDeniedError):  # the Responses dialect too
            await openai.AsyncOpenAI(base_url=gw.base_url("sx"), api_key="any", max_retries=0).responses.create(
                model=M, input="more", max_output_tokens=3
            )

        # A call generating when the seal lands: refused as it would be recorded (the stream ends with an error).
        client = openai.AsyncOpenAI(base_url=gw.base_url("race"), api_key="any", max_retries=0)
        s = await client.chat.completions.create(
            model=M,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=8,
            stream=True,
        )
        with pytest.raises(openai.APIError, match="sealed"):
            async for _ in s:
                await gw.recorder.seal("race")
        assert await gw.seal_execution("race") == 0

        stream.max_msgs = -1
        await log.js.update_stream(stream)
        assert await asyncio.wait_for(seal, 60) == 2
        assert sorted(await _recorded(log, "sx")) == sorted(answered)  # in the log before the count came back
        assert await gw.seal_execution("sx") == 2  # idempotent
    finally:
        await gw.stop()
        await log.close()
        nats.server.stop()


async def test_a_call_sealed_while_it_streams_ends_with_the_refusal_a_later_call_gets_in_each_dialect(
    tmp_path: Path, engine_a: EngineServer
) -> None:
    """Not a server error: the 403-style permission error (``execution_sealed``) of the unstreamed path, in each
    dialect's in-stream error shape (docs/proxy.md; PROTOCOLS: OpenAI ``data: {"error": ...}``, Anthropic
    ``event: error``, Responses ``event: error`` with a code)."""
    nats = Nats(tmp_path / "nats")
    log = await EventLog.connect(nats.url, LogConfig(stream="SEALS", prefix="seals.ev", blob_bucket="SEALSB"))
    gw = Gateway(GatewayConfig(require_key=False, outbox_path=str(tmp_path / "outbox.sqlite3")), event_log=log)
    await gw.pool.add("e0", engine_a.url)
    await gw.start()
    try:
        chat = openai.AsyncOpenAI(base_url=gw.base_url("chat"), api_key="any", max_retries=0)
        s = await chat.chat.completions.create(
            model=M, messages=[{"role": "user", "content": "x"}], max_tokens=8, stream=True
        )
        with pytest.raises(openai.APIError) as oa:
            async for _ in s:
                await gw.recorder.seal("chat")
        assert (oa.value.type, oa.value.code) == ("permission_error", "execution_sealed")
        assert "sealed" in oa.value.message

        claude = anthropic.AsyncAnthropic(base_url=f"{gw.url}/x/claude", api_key="any", max_retries=0)
        ms = await claude.messages.create(
            model=M, max_tokens=8, messages=[{"role": "user", "content": "x"}], stream=True
        )
        with pytest.raises(anthropic.APIStatusError) as an:
            async for _ in ms:
                await gw.recorder.seal("claude")
        assert isinstance(an.value.body, dict) and an.value.body["error"]["type"] == "permission_error"
        assert "sealed" in an.value.body["error"]["message"]

        responses = openai.AsyncOpenAI(base_url=gw.base_url("resp"), api_key="any", max_retries=0)
        rs = await responses.responses.create(model=M, input="x", max_output_tokens=8, stream=True)
        events = []
        async for ev in rs:
            events.append(ev)
            await gw.recorder.seal("resp")
        last = events[-1]
        assert last.type == "error" and last.code == "execution_sealed" and "sealed" in last.message
        assert not any(e.type == "response.completed" for e in events)
        for eid in ("chat", "claude", "resp"):
            assert await gw.seal_execution(eid) == 0  # refused, so nothing recorded
    finally:
        await gw.stop()
        await log.close()
        nats.server.stop()


@pytest.mark.slow
async def test_a_seal_survives_a_sigkill_of_the_proxy(tmp_path: Path, engine_a: EngineServer) -> None:
    nats = Nats(tmp_path / "nats")
    log, stream = await _refusing_log(nats, "SEALK")
    outbox = tmp_path / "outbox.sqlite3"
    cfg = GatewayConfig(require_key=False, outbox_path=str(outbox), stop_drain_timeout_s=0.5)
    proxy = Proxy(nats, log.config, engine_a.url, outbox)
    try:
        gw = Gateway(cfg, event_log=log)
        await gw.pool.add("e0", engine_a.url)
        await gw.start()
        try:
            answered = await _chat_turns(gw.base_url("kx"), 3)
        finally:
            await gw.stop()  # the log refuses: the three calls stay in the outbox file
        await proxy.start("kx")  # seals kx, then says where it serves
        proxy.sigkill()  # after the seal, before any of kx's calls reached the log

        gw = Gateway(cfg, event_log=log)
        await gw.pool.add("e0", engine_a.url)
        await gw.start()
        try:
            with pytest.raises(openai.PermissionDeniedError):
                await _chat_turns(gw.base_url("kx"), 1)
            stream.max_msgs = -1
            await log.js.update_stream(stream)
            assert await asyncio.wait_for(gw.seal_execution("kx"), 60) == 3
            assert sorted(await _recorded(log, "kx")) == sorted(answered)
        finally:
            await gw.stop()
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.sigkill()
        await log.close()
        nats.server.stop()


def _outbox_executions(path: Path) -> list[tuple[str, int]]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT execution_id, sealed FROM outbox_executions"))


async def test_the_outbox_forgets_the_seals_the_log_holds_and_the_store_still_refuses_their_calls(
    tmp_path: Path, engine_a: EngineServer, engine: Engine
) -> None:
    nats = Nats(tmp_path / "nats")
    log = await EventLog.connect(nats.url, LogConfig(stream="PRUNE", prefix="prune.ev", blob_bucket="PRUNEB"))
    outbox = tmp_path / "outbox.sqlite3"
    cfg = GatewayConfig(require_key=False, outbox_path=str(outbox), stop_drain_timeout_s=5)
    sealed = SealedFinishes(engine)
    runner = ProjectionRunner(TrajectoryProjection(), log, engine)
    stop = asyncio.Event()
    folding = asyncio.create_task(runner.run(stop))
    try:
        gw = Gateway(cfg, event_log=log, sealed=sealed)
        await gw.pool.add("e0", engine_a.url)
        await gw.start()
        try:
            for eid in ("done-0", "done-1", "scoring", "running"):
                await _chat_turns(gw.base_url(eid), 2)
            counts = {eid: await gw.seal_execution(eid) for eid in ("done-0", "done-1", "scoring")}
            assert counts == {"done-0": 2, "done-1": 2, "scoring": 2}
            # Scored: the finishes with the count are in the log ("scoring" is not yet, "running" goes on).
            await log.append_many(
                [
                    ExecutionFinished(execution_id=e, status="completed", score=1.0, recorded_calls=2)
                    for e in ("done-0", "done-1")
                ]
            )
            await runner.wait_caught_up(60)
            assert len(_outbox_executions(outbox)) == 4
            assert await gw.recorder.prune_sealed() == 2
            assert _outbox_executions(outbox) == [("running", 0), ("scoring", 1)]
            assert await gw.recorder.prune_sealed() == 0  # nothing more the log holds

            with pytest.raises(openai.PermissionDeniedError):  # the store answers for the forgotten seal
                await _chat_turns(gw.base_url("done-0"), 1)
            assert await gw.seal_execution("done-0") == 2  # idempotent still, with the count the log holds
            with pytest.raises(openai.PermissionDeniedError):
                await _chat_turns(gw.base_url("scoring"), 1)
        finally:
            await gw.stop()

        gw = Gateway(cfg, event_log=log, sealed=sealed)  # a restart: the file holds two executions, not four
        await gw.pool.add("e0", engine_a.url)
        await gw.start()
        try:
            for eid in ("done-1", "scoring"):
                with pytest.raises(openai.PermissionDeniedError):
                    await _chat_turns(gw.base_url(eid), 1)
            assert len(await _chat_turns(gw.base_url("running"), 1)) == 1
            assert _outbox_executions(outbox) == [("running", 0), ("scoring", 1)]
            await gw.recorder.flush()
            calls = [e.execution_id async for _, e in log.events(ModelCallRecorded)]
            assert sorted(calls) == sorted(["done-0"] * 2 + ["done-1"] * 2 + ["scoring"] * 2 + ["running"] * 3)
        finally:
            await gw.stop()
    finally:
        stop.set()
        await folding
        await log.close()
        nats.server.stop()
