"""The proxy's pool with the CPU engines' KV migrator: a drained stream's KV moves to the next engine, which
computes only the one token the first had not, and the record is still exactly what the engines produced."""

from __future__ import annotations

import pytest

from opengyre.engine import EngineConfig, EngineKVMigrator, EngineServer
from opengyre.eventlog import EventLog

from .conftest import make_stack

LONG = 600


@pytest.mark.parametrize("migrate", [True, False])
async def test_a_drained_stream_continues_on_the_kv_it_had(event_log: EventLog, migrate: bool) -> None:
    cfg = EngineConfig(port=0, incremental_streaming_output=True)
    async with EngineServer(cfg) as a, EngineServer(cfg) as b:
        st = await make_stack(event_log, {"e0": a, "e1": b})
        migrator = EngineKVMigrator()
        if migrate:
            st.gateway.pool.migrator = migrator
        try:
            stream = await st.openai("ex-kv").chat.completions.create(
                model="opengyre-tiny",
                messages=[{"role": "user", "content": "x"}],
                max_tokens=LONG,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            chunks, finish, source = 0, None, ""
            async for ch in stream:
                if ch.choices:
                    finish = ch.choices[0].finish_reason or finish
                chunks += 1
                if chunks == 10:
                    source = next(h.engine_id for h in st.gateway.pool.engines() if h.inflight)
                    await st.gateway.pool.drain(source)
            assert finish == "length"
            events = await st.assert_recorded_matches_engines()  # every token once, as the engines produced them
            e = events[0]
            assert e.attempts == 2 and len(e.output_ids) == LONG
            first, second = st.engine_records(e.call_id)
            target = b if source == "e0" else a
            moved = len(first.input_ids) + len(first.output_ids) - 1  # the old engine's KV: all but its last token
            if migrate:
                assert migrator.migrated == 1 and migrator.tokens == moved
                assert second.cached_tokens == moved and target.engine.scheduler.kv_imported_tokens == moved
                # The target computed one prompt position, where a re-prefill computes every one.
                assert target.engine.scheduler.prefill_tokens == 1
            else:
                assert second.cached_tokens == 0 and target.engine.scheduler.prefill_tokens == len(second.input_ids)
        finally:
            await migrator.close()
            await st.gateway.stop()
