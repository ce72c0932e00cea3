"""Every answered call is in the log exactly once: the outbox holds calls while nats-server is away (SIGKILL),
refuses new calls when full, and a drainer that finds rows the log already has does not send them again."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ModelCallRecorded
from opengyre.proxy.recording._outbox import Outbox
from opengyre.proxy.recording._recorder import Recorder
from opengyre.runtime import EmbeddedNats

from .._polling import await_until
from .conftest import Stack, make_stack

M = "opengyre-tiny"


class Nats:
    """A nats-server of the test's own, to SIGKILL and start again on the same port and store."""

    def __init__(self, store: Path) -> None:
        self.server = EmbeddedNats(store)
        self.server.start()

    @property
    def url(self) -> str:
        return self.server.url

    def kill(self) -> None:
        assert self.server.proc is not None
        self.server.proc.kill()  # SIGKILL: no flush, no goodbye to clients
        self.server.proc.wait()
        self.server.stop()

    def restart(self) -> None:
        self.server = EmbeddedNats(self.server.store_dir, port=self.server.port)
        self.server.start()


@pytest.fixture
async def own_nats(tmp_path: Path) -> AsyncIterator[Nats]:
    nats = Nats(tmp_path / "nats")
    yield nats
    nats.server.stop()


def assert_exactly_once_in_order(events: list[ModelCallRecorded], answered: list[str]) -> None:
    ids = [e.call_id for e in events]
    assert len(ids) == len(set(ids)), "a call was recorded twice"
    assert sorted(ids) == sorted(answered), "recorded calls differ from answered calls"
    seen: set[str] = set()
    for e in events:
        assert e.parent_call_id is None or e.parent_call_id in seen, f"{e.call_id} precedes its parent"
        seen.add(e.call_id)


class Conversations:
    """A few executions, each a growing conversation (every call extends the previous one: parent and child)."""

    def __init__(self, st: Stack, n: int) -> None:
        self.st = st
        self.msgs: dict[str, list[dict[str, Any]]] = {
            f"ex-{k}": [{"role": "user", "content": f"t{k}"}] for k in range(n)
        }
        self.answered: list[str] = []

    async def turn(self) -> None:
        async def one(eid: str) -> None:
            msgs = self.msgs[eid]
            r = await self.st.openai(eid).chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
            self.answered.append(r.id.removeprefix("chatcmpl-"))
            msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go on"}]

        await asyncio.gather(*(one(eid) for eid in self.msgs))


async def test_calls_answered_while_nats_server_is_killed_are_recorded_once(
    own_nats: Nats, engine_a: EngineServer, tmp_path: Path
) -> None:
    log = await EventLog.connect(own_nats.url)
    st = await make_stack(log, {"e0": engine_a}, outbox_path=str(tmp_path / "outbox.sqlite3"))
    try:
        convs = Conversations(st, 3)
        await convs.turn()
        await st.gateway.recorder.flush()
        # A call in flight (its first tokens streamed) when nats-server is SIGKILLed, then finished.
        stream = await st.openai("ex-s").chat.completions.create(
            model=M, messages=[{"role": "user", "content": "s"}], max_tokens=16, stream=True
        )
        first = await anext(stream)
        own_nats.kill()
        async for _ in stream:
            pass
        convs.answered.append(first.id.removeprefix("chatcmpl-"))
        await convs.turn()  # answered while the log is gone
        await convs.turn()
        rec = st.gateway.recorder
        # Held for as long as the log stays away (the recorder that gave up after 5 retries lost these).
        await await_until(lambda: rec.send_failures >= 8, "the recorder kept trying the log")
        assert rec.pending == 7 and rec.failed == 0
        own_nats.restart()
        await convs.turn()
        await rec.flush()
        events = await st.assert_recorded_matches_engines()
        assert_exactly_once_in_order(events, convs.answered)
        assert len(events) == 13 and any(e.parent_call_id for e in events)
    finally:
        await st.gateway.stop()
        await log.close()


async def test_a_full_outbox_refuses_new_calls_with_retry_after_in_each_dialect(
    own_nats: Nats, engine_a: EngineServer, tmp_path: Path
) -> None:
    log = await EventLog.connect(own_nats.url)
    st = await make_stack(
        log, {"e0": engine_a}, outbox_path=str(tmp_path / "o.sqlite3"), outbox_max_events=2, outbox_retry_after_s=7
    )
    try:
        own_nats.kill()
        answered = []
        for i in range(2):
            r = await st.openai(f"ex-{i}").chat.completions.create(
                model=M, messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
            answered.append(r.id.removeprefix("chatcmpl-"))
        with pytest.raises(openai.APIStatusError) as oa:
            await st.openai("ex-2").chat.completions.create(
                model=M, messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert oa.value.status_code == 503 and oa.value.response.headers["retry-after"] == "7"
        assert oa.value.body["type"] == "server_error" and "recording is behind" in oa.value.body["message"]  # type: ignore[index]
        with pytest.raises(anthropic.APIStatusError) as an:
            await st.anthropic("ex-3").messages.create(
                model=M, messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert an.value.status_code == 529 and an.value.response.headers["retry-after"] == "7"
        assert an.value.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert st.gateway.recorder.pending == 2  # bounded: the refused calls did not run
        assert len(engine_a.engine.request_log()) == 2
        own_nats.restart()
        await st.gateway.recorder.flush()
        r = await st.openai("ex-2").chat.completions.create(
            model=M, messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        answered.append(r.id.removeprefix("chatcmpl-"))
        assert_exactly_once_in_order(await st.recorded(), answered)
    finally:
        await st.gateway.stop()
        await log.close()


def _call(i: int) -> ModelCallRecorded:
    return ModelCallRecorded(
        execution_id="ex",
        call_id=f"c{i}",
        parent_call_id=f"c{i - 1}" if i else None,
        prefix_len=0,
        prompt_delta_ids=[1, 2, 3],
        output_ids=[4, 5],
        output_logprobs=[-0.5, -1.5],
    )


async def _outlive_duplicate_window(log: EventLog) -> None:
    """Wait until JetStream no longer drops a repeat of what was published so far (observed, not timed)."""
    subject, probe = f"{log.config.prefix}.probe.p", uuid.uuid4().hex
    await log.js.publish(subject, b"", headers={"Nats-Msg-Id": probe})

    async def passed() -> bool:
        return not (await log.js.publish(subject, b"", headers={"Nats-Msg-Id": probe})).duplicate

    await await_until(passed, "the stream's duplicate window passed", every=0.1)


async def test_rows_the_log_already_holds_are_not_sent_again_after_the_duplicate_window(
    nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:8]
    cfg = LogConfig(stream=f"R{tag}", prefix=f"r{tag}.ev", blob_bucket=f"RB{tag}", duplicate_window_s=0.5)
    log = await EventLog.connect(nats_server.url, cfg)
    path = tmp_path / "outbox.sqlite3"
    calls = [_call(i) for i in range(6)]
    try:
        # What a drainer SIGKILLed after the log acknowledged a batch and before it removed the rows leaves
        # behind: the rows, the position recorded before its first publish, and the first four in the log.
        outbox = await Outbox(path).open()
        for c in calls:
            synced = outbox.put(c)
            if synced is not None:
                await synced
        await outbox.set_confirmed(await log.last_seq())
        await log.append_many(calls[:4])
        await outbox.close()
        await _outlive_duplicate_window(log)  # JetStream's own dedup can no longer hide a repeat

        rec = Recorder(log, outbox_path=path)
        await rec.start()
        await rec.flush()
        await rec.stop()
        logged = [e async for _, e in log.events(ModelCallRecorded)]
        assert [e.event_id for e in logged] == [c.event_id for c in calls]
        assert rec.found_in_log == 4
    finally:
        await log.js.delete_stream(cfg.stream)
        await log.close()


async def test_concurrent_calls_are_each_recorded_once_while_the_drainer_runs(
    event_log: EventLog, tmp_path: Path
) -> None:
    """64 executions record 20 calls each at once (group commits, fsyncs) while the drainer sends and removes."""
    rec = Recorder(event_log, outbox_path=tmp_path / "outbox.sqlite3", batch=1)
    await rec.start()
    try:

        async def execution(k: int) -> None:
            parent = None
            for i in range(20):
                call = ModelCallRecorded(
                    execution_id=f"ex{k}",
                    call_id=f"c{k}-{i}",
                    parent_call_id=parent,
                    prompt_delta_ids=[1, 2],
                    output_ids=[3],
                    output_logprobs=[-1.0],
                )
                synced = rec.record(call)
                if synced is not None:
                    await synced
                parent = call.call_id

        await asyncio.gather(*(execution(k) for k in range(64)))
        await rec.flush()
    finally:
        await rec.stop()
    events = [e async for _, e in event_log.events(ModelCallRecorded)]
    assert_exactly_once_in_order(events, [f"c{k}-{i}" for k in range(64) for i in range(20)])


async def test_a_call_no_store_could_keep_is_refused_in_the_dialect_and_not_recorded(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    """A NUL in a field the event schema types as text (the model name, accepted by a pattern): the log would
    refuse the event, so the call is answered with the dialect's error, not as an unrecorded success."""
    st = await make_stack(event_log, {"e0": engine_a}, model_patterns=("claude-*",))
    try:
        with pytest.raises(openai.APIStatusError) as oa:
            await st.openai("ex-nul").chat.completions.create(
                model="claude-\x00", messages=[{"role": "user", "content": "x"}], max_tokens=2
            )
        assert oa.value.status_code == 500 and "NUL" in str(oa.value.body["message"])  # type: ignore[index]
        assert await st.recorded() == []
        assert st.gateway.recorder.failed == 1
    finally:
        await st.gateway.stop()
