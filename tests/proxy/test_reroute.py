"""Engines leave mid-request: drained by an operator or by a cell-role change, or killed. The harness sees one
complete answer; the record is the concatenation of what each engine produced, with nothing lost or doubled."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from opengyre.engine import EngineConfig, EngineProcess, EngineServer
from opengyre.eventlog import EventLog
from opengyre.events import CellEngineChanged, CellRegistered, CellRoleChanged
from opengyre.proxy.engines._cells import CellWatcher
from opengyre.wire import Outcome, assemble

from .._polling import await_until
from .conftest import Stack, make_stack

M = "opengyre-tiny"
LONG = 2000  # tokens: a generation that is certainly still running when the drain comes


def _fast() -> EngineConfig:
    # Delta chunks (SGLang's --incremental-streaming-output, which the pool detects): long streams stay linear.
    return EngineConfig(port=0, incremental_streaming_output=True)


@pytest.fixture
async def engine_a() -> AsyncIterator[EngineServer]:
    async with EngineServer(_fast()) as srv:
        yield srv


@pytest.fixture
async def engine_b() -> AsyncIterator[EngineServer]:
    async with EngineServer(_fast()) as srv:
        yield srv


def _busy_engine(st: Stack) -> str:
    busy = [h.engine_id for h in st.gateway.pool.engines() if h.inflight]
    assert len(busy) == 1
    return busy[0]


def _text_of(st: Stack, output_ids: list[int]) -> str:
    out = Outcome(output_ids=output_ids, finish={"type": "length", "length": len(output_ids)})
    return assemble(st.gateway.codec, out).content


async def test_an_openai_stream_survives_a_drain(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a, "e1": engine_b})
    try:
        client = st.openai("ex-drain")
        stream = await client.chat.completions.create(
            model=M,
            messages=[{"role": "user", "content": "write a lot"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        text, chunks, finish, moved = "", 0, None, -1
        streamed_ids: list[int] = []
        async for ch in stream:
            if not ch.choices:
                continue
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
            streamed_ids += getattr(ch.choices[0], "token_ids", None) or []
            chunks += 1
            if chunks == 10:
                moved = await st.gateway.pool.drain(_busy_engine(st))
        assert moved == 1 and finish == "length"
        events = await st.assert_recorded_matches_engines()
        e = events[0]
        assert e.attempts == 2 and len(e.output_ids) == LONG and e.engine_id in ("e0,e1", "e1,e0")
        first = st.engine_records(e.call_id)[0]
        assert first.finish_reason["type"] == "abort" and 0 < len(first.output_ids) < LONG
        assert text == _text_of(st, list(e.output_ids))  # every token once, in order
        assert streamed_ids == list(e.output_ids)
        assert [h.engine_id for h in st.gateway.pool.engines()] == ["e1" if e.engine_id.startswith("e0") else "e0"]
    finally:
        await st.gateway.stop()


async def test_cell_role_changes_drain_and_reroute_an_anthropic_stream(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {})
    st.engines.update({"cell-a": engine_a, "cell-b": engine_b})
    watcher = CellWatcher(event_log, st.gateway.pool)
    await watcher.start()
    try:
        await event_log.append(CellRegistered(cell_id="cell-a", role="rollout", engine_url=engine_a.url))
        await await_until(
            lambda: len(st.gateway.pool.engines()) >= 1,
            "the pool has an engine",
            polls=12000,
            every=0.01,
        )
        client = st.anthropic("ex-cells")
        msgs: Any = [{"role": "user", "content": "write a lot"}]
        async with client.messages.stream(
            model=M, max_tokens=LONG, messages=msgs, extra_body={"ignore_eos": True}
        ) as s:
            n = 0
            async for ev in s:
                n += ev.type == "content_block_delta"
                if n == 10:
                    await event_log.append(CellRegistered(cell_id="cell-b", role="rollout", engine_url=engine_b.url))
                    await event_log.append(
                        CellRoleChanged(cell_id="cell-a", from_role="rollout", to_role="draining", reason="train")
                    )
            final = await s.get_final_message()
        assert final.stop_reason == "max_tokens" and final.usage.output_tokens == LONG
        events = await st.assert_recorded_matches_engines()
        assert events[0].attempts == 2 and events[0].engine_id == "cell-a,cell-b"
        assert "".join(b.text for b in final.content if b.type == "text") == _text_of(st, list(events[0].output_ids))
        assert watcher.roles == {"cell-a": "draining", "cell-b": "rollout"}
        # Back to rollout: the cell takes requests again, from the URL it registered with.
        await event_log.append(CellRoleChanged(cell_id="cell-a", from_role="draining", to_role="rollout"))
        await await_until(
            lambda: st.gateway.pool.get("cell-a") is not None,
            "the pool has cell-a",
            polls=12000,
            every=0.01,
        )
    finally:
        await watcher.stop()
        await st.gateway.stop()


class _BrokenMigrator:
    """A KV-migration hook that fails after a suspension (an RDMA transfer that breaks)."""

    def __init__(self) -> None:
        self.calls = 0

    async def migrate(self, rid: str, source: object, target: object, tokens: object) -> bool:
        self.calls += 1
        await asyncio.sleep(0)
        raise ConnectionError("the KV transfer broke")


async def test_a_failed_kv_migration_falls_back_to_re_prefill(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a, "e1": engine_b})
    try:
        migrator = _BrokenMigrator()
        st.gateway.pool.migrator = migrator
        stream = await st.openai("ex-kv").chat.completions.create(
            model=M,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        chunks, finish = 0, None
        async for ch in stream:
            if ch.choices:
                finish = ch.choices[0].finish_reason or finish
            chunks += 1
            if chunks == 10:
                await st.gateway.pool.drain(_busy_engine(st))
        assert migrator.calls == 1 and finish == "length"
        events = await st.assert_recorded_matches_engines()
        assert events[0].attempts == 2 and len(events[0].output_ids) == LONG
        assert all(not h.inflight for h in st.gateway.pool.engines())  # the re-issue gave its slot back
    finally:
        await st.gateway.stop()


async def test_a_non_streamed_call_survives_a_drain(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a, "e1": engine_b})
    try:
        task = asyncio.create_task(
            st.anthropic("ex-ns").messages.create(
                model=M, max_tokens=LONG, messages=[{"role": "user", "content": "x"}], extra_body={"ignore_eos": True}
            )
        )
        await await_until(
            lambda: any(h.inflight for h in st.gateway.pool.engines()),
            "a request is in flight",
            polls=24000,
            every=0.005,
        )
        await await_until(
            lambda: engine_a.engine.scheduler.steps + engine_b.engine.scheduler.steps >= 20,
            "the engines stepped 20 times",
            polls=24000,
            every=0.005,
        )
        assert await st.gateway.pool.drain(_busy_engine(st)) == 1
        msg = await task
        assert msg.stop_reason == "max_tokens" and msg.usage.output_tokens == LONG
        events = await st.assert_recorded_matches_engines()
        assert events[0].attempts == 2
    finally:
        await st.gateway.stop()


async def test_a_killed_engine_is_replaced_mid_stream(event_log: EventLog, engine_b: EngineServer) -> None:
    async with EngineProcess(EngineConfig(port=0, threads=1, incremental_streaming_output=True)) as proc:
        st = await make_stack(event_log, {})
        try:
            await st.gateway.pool.add("doomed", proc.url)
            client = st.openai("ex-kill")
            stream = await client.chat.completions.create(
                model=M,
                messages=[{"role": "user", "content": "x"}],
                max_tokens=LONG,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            text, chunks, finish = "", 0, None
            async for ch in stream:
                if not ch.choices:
                    continue
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
                chunks += 1
                if chunks == 10:
                    await st.gateway.pool.add("spare", engine_b.url)
                    proc.kill()
            assert finish == "length"
            events = await st.recorded()
            e = events[0]
            assert e.attempts == 2 and e.engine_id == "doomed,spare" and len(e.output_ids) == LONG
            # The spare engine continued exactly from the tokens the client had already received.
            spare = engine_b.engine.request_log(f"{e.call_id}-2")[0]
            n_first = LONG - len(spare.output_ids)
            assert list(spare.output_ids) == list(e.output_ids[n_first:])
            assert text == _text_of(st, list(e.output_ids))
        finally:
            await st.gateway.stop()


async def test_a_drain_with_nowhere_to_go_ends_the_stream_with_an_error(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a}, queue_timeout_s=0.2)
    try:
        stream = await st.openai("ex-alone").chat.completions.create(
            model=M,
            messages=[{"role": "user", "content": "x"}],
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        n = 0
        try:
            async for _ in stream:
                n += 1
                if n == 5:
                    await st.gateway.pool.drain("e0")
            raise AssertionError("the stream ended without an error")
        except openai.APIError as exc:
            assert "no rollout engine" in str(exc)
        assert await st.recorded() == []  # an unfinished generation is not a trajectory
    finally:
        await st.gateway.stop()


async def test_anthropic_stream_error_event_when_nothing_can_continue(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a}, queue_timeout_s=0.2)
    try:
        client = st.anthropic("ex-alone-a")
        try:
            async with client.messages.stream(
                model=M, max_tokens=LONG, messages=[{"role": "user", "content": "x"}], extra_body={"ignore_eos": True}
            ) as s:
                n = 0
                async for _ in s:
                    n += 1
                    if n == 5:
                        await st.gateway.pool.drain("e0")
            raise AssertionError("the stream ended without an error")
        except anthropic.APIStatusError as exc:
            assert exc.body["error"]["type"] == "overloaded_error"  # type: ignore[index]
        assert st.gateway.failed_calls("ex-alone-a") == 1  # the in-stream error is the engines' failure
    finally:
        await st.gateway.stop()


async def test_an_engine_that_leaves_the_pool_leaves_no_connection_open(
    event_log: EventLog, engine_a: EngineServer, engine_b: EngineServer
) -> None:
    st = await make_stack(event_log, {"e0": engine_a})
    try:
        pool = st.gateway.pool
        first = pool.get("e0")
        assert first is not None
        await st.openai("ex-conn").chat.completions.create(
            model=M, messages=[{"role": "user", "content": "x"}], max_tokens=2
        )
        kept = list(first.client.fast._idle)  # the call's keep-alive connection
        assert kept and not any(c.writer.is_closing() for c in kept)
        await pool.add("e0", engine_b.url)  # re-pointed: the old client's connections go
        assert all(c.writer.is_closing() for c in kept)
        second = pool.get("e0")
        assert second is not None and second is not first
        await st.openai("ex-conn-2").chat.completions.create(
            model=M, messages=[{"role": "user", "content": "y"}], max_tokens=2
        )
        kept = list(second.client.fast._idle)
        assert kept
        await pool.drain("e0")  # removed: so are its connections
        assert all(c.writer.is_closing() for c in kept)
    finally:
        await st.gateway.stop()


async def test_a_cell_whose_url_no_client_speaks_is_skipped(event_log: EventLog) -> None:
    from opengyre.proxy import EnginePool
    from opengyre.runtime import free_port

    pool = EnginePool()
    try:
        watcher = CellWatcher(event_log, pool)  # applied directly: the watcher's loop must outlive a bad cell
        await watcher.apply(CellRegistered(cell_id="c-tls", role="rollout", engine_url="https://engine:443"))
        await watcher.apply(
            # never bound: the pool only records the URL
            CellRegistered(cell_id="c-ok", role="rollout", engine_url=f"http://127.0.0.1:{free_port()}")
        )
        assert [h.engine_id for h in pool.engines()] == ["c-ok"]
    finally:
        await pool.close()


async def test_a_cell_whose_engine_changed_is_routed_to_the_new_one_in_any_role(event_log: EventLog) -> None:
    from opengyre.proxy import EnginePool
    from opengyre.runtime import free_port

    old, new, later = (f"http://127.0.0.1:{free_port()}" for _ in range(3))  # never bound: URLs only
    pool = EnginePool()
    try:
        watcher = CellWatcher(event_log, pool)
        await watcher.apply(CellRegistered(cell_id="c0", role="rollout", engine_url=old))
        await watcher.apply(CellEngineChanged(cell_id="c0", engine_url=new))
        h = pool.get("c0")
        assert h is not None and h.url == new and watcher.roles == {"c0": "rollout"}
        # Off rollout the new URL is remembered, and used once the cell is back.
        await watcher.apply(CellRoleChanged(cell_id="c0", from_role="rollout", to_role="draining"))
        await watcher.apply(CellEngineChanged(cell_id="c0", engine_url=later))
        await watcher.apply(CellRoleChanged(cell_id="c0", from_role="draining", to_role="rollout"))
        h = pool.get("c0")
        assert h is not None and h.url == later
        await watcher.apply(CellEngineChanged(cell_id="nope", engine_url=new))  # unknown cell: skipped
        assert [h.engine_id for h in pool.engines()] == ["c0"]
    finally:
        await pool.close()


async def test_a_dead_engine_is_probed_out_of_and_back_into_routing(
    event_log: EventLog, engine_b: EngineServer
) -> None:
    # The port stays bound (not listening: connects are refused) until the engine comes back on it, so no other
    # xdist worker's free_port() can hand it out in between; the engine binds with SO_REUSEADDR beside it.
    reserve = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reserve.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    reserve.bind(("127.0.0.1", 0))
    port = int(reserve.getsockname()[1])
    st = await make_stack(event_log, {})
    try:
        pool = st.gateway.pool
        pool.probe_interval_s = 0.05
        await pool.add("dead", f"http://127.0.0.1:{port}")
        await pool.add("live", engine_b.url)
        st.engines["live"] = engine_b
        for i in range(5):  # a new execution each time: no affinity, the least loaded engine (in order) first
            r = await st.openai(f"ex-dead-{i}").chat.completions.create(
                model=M, messages=[{"role": "user", "content": f"call {i}"}], max_tokens=2
            )
            assert r.choices[0].finish_reason in ("stop", "length")
        events = await st.recorded()
        assert [e.attempts for e in events[:3]] == [2, 2, 2]  # each paid one failed connect
        assert [e.attempts for e in events[3:]] == [1, 1] and pool.get("dead").state == "unhealthy"  # type: ignore[union-attr]
        async with EngineServer(EngineConfig(port=port, incremental_streaming_output=True)):
            await await_until(
                lambda: pool.get("dead").state == "active",  # type: ignore[union-attr]
                "the engine that came back is active",
                polls=6000,
                every=0.02,
            )
    finally:
        await st.gateway.stop()
        reserve.close()


async def test_the_calls_the_gateway_failed_are_counted_per_execution_and_a_callers_error_is_not(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    """What a harness's "the model failed" is checked by (the seal's ``failed_calls``): a call no engine could finish
    (no capacity: 429) counts for its execution, streamed or not; a request the caller got wrong (400) does not."""
    st = await make_stack(event_log, {"e0": engine_a}, queue_timeout_s=0.2)
    try:
        client = st.openai("ex-count")
        msgs: Any = [{"role": "user", "content": "x"}]
        await client.chat.completions.create(model=M, max_tokens=2, messages=msgs)
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(model=M, max_tokens=2, messages=msgs, temperature=-1)
        assert st.gateway.failed_calls("ex-count") == 0
        await st.gateway.pool.drain("e0")  # no engine left: calls wait out the queue, then 429
        with pytest.raises(openai.RateLimitError):
            await client.chat.completions.create(model=M, max_tokens=2, messages=msgs)
        with pytest.raises(openai.RateLimitError):
            async for _ in await client.chat.completions.create(model=M, max_tokens=2, messages=msgs, stream=True):
                pass
        assert st.gateway.failed_calls("ex-count") == 2
        assert st.gateway.failed_calls("ex-other") == 0
    finally:
        await st.gateway.stop()


async def test_an_execution_that_floods_past_its_own_bound_cannot_blame_the_model(
    event_log: EventLog, engine_a: EngineServer
) -> None:
    """Flood-then-forge: an execution that floods the gateway until its calls get capacity errors could then say
    "the model failed" and be masked. Its requests past ``own_excess_inflight`` (held or waiting) are refused at
    once (429), and none of its capacity failures count into ``failed_calls`` once it went past its bound; an
    execution within its bound still has its capacity failures counted."""
    st = await make_stack(event_log, {"e0": engine_a}, queue_timeout_s=2.0, own_excess_inflight=2)
    try:
        msgs: Any = [{"role": "user", "content": "x"}]
        flood, honest = st.openai("ex-flood"), st.openai("ex-honest")
        await st.gateway.pool.drain("e0")  # no engine: calls wait in the queue, then 429
        held = [
            asyncio.create_task(flood.chat.completions.create(model=M, max_tokens=2, messages=msgs)) for _ in range(2)
        ]
        await await_until(lambda: st.gateway.pool.held("ex-flood") == 2, "the flood's first two calls wait")
        for _ in range(3):  # past the bound: refused at once, not queued
            with pytest.raises(openai.RateLimitError, match="own_excess_inflight"):
                await flood.chat.completions.create(model=M, max_tokens=2, messages=msgs)
        with pytest.raises(openai.RateLimitError):  # within its bound: the queue's timeout
            await honest.chat.completions.create(model=M, max_tokens=2, messages=msgs)
        for t in held:
            with pytest.raises(openai.RateLimitError):
                await t
        assert st.gateway.failed_calls("ex-flood") == 0  # five capacity failures, all of its own making
        assert st.gateway.failed_calls("ex-honest") == 1
        assert st.gateway.pool.held("ex-flood") == 0 and st.gateway.pool.held("ex-honest") == 0
    finally:
        await st.gateway.stop()
