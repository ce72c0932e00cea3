"""Calls the proxy answered before their execution finished but handed to the log after its finish (the log
refused them, the proxy stopped with them in its outbox, the runtime appended the finish meanwhile, the proxy
came back and drained them) are applied by the trainer's projection like every other answered call: answered ==
applied, nothing dead-lettered. This is the path of finishes without the proxy's count of recorded calls (a
runtime that does not seal); sealed executions are in test_sealed_calls.py and tests/proxy/test_seal.py."""

from __future__ import annotations

from pathlib import Path

import openai
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from sqlalchemy import Engine, select

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.projection import ProjectionRunner
from opengyre.proxy import Gateway, GatewayConfig
from opengyre.runtime import EmbeddedNats
from opengyre.store import DeadLetter
from opengyre.trainer import TrainerProjection, TrainerStore

from ._events import catch_up

M = "opengyre-tiny"
EXECUTIONS = ("late-0", "late-1")


async def test_calls_drained_after_their_executions_finish_are_applied(tmp_path: Path, engine: Engine) -> None:
    nats = EmbeddedNats(tmp_path / "nats")
    nats.start()
    cfg = LogConfig(stream="LATE", prefix="late.ev", blob_bucket="LATEB")
    log = await EventLog.connect(nats.url, cfg)  # made with no limit: narrowed below
    # The stream takes the two dispatches, then refuses: every answered call waits in the proxy's outbox.
    stream = StreamConfig(
        name=cfg.stream, subjects=[cfg.all_subjects], storage=StorageType.FILE, max_msgs=2, discard=DiscardPolicy.NEW
    )
    await log.js.update_stream(stream)
    await log.append_many(
        [ExecutionDispatched(execution_id=e, task_id="t", group_id="g", group_size=2) for e in EXECUTIONS]
    )
    gw_cfg = GatewayConfig(require_key=False, outbox_path=str(tmp_path / "outbox.sqlite3"), stop_drain_timeout_s=0.5)
    answered: dict[str, list[str]] = {e: [] for e in EXECUTIONS}
    try:
        async with EngineServer(EngineConfig(port=0)) as srv:
            gw = Gateway(gw_cfg, event_log=log)
            await gw.pool.add("e0", srv.url)
            await gw.start()
            try:
                for eid in EXECUTIONS:  # each harness: three turns, each extending the last
                    client = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key="any", max_retries=0)
                    msgs: list[dict[str, object]] = [{"role": "user", "content": f"task {eid}"}]
                    for _ in range(3):
                        r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
                        answered[eid].append(r.id.removeprefix("chatcmpl-"))
                        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
                assert gw.recorder.pending == 6
            finally:
                await gw.stop()  # the log still refuses: the six calls stay in the outbox file
            stream.max_msgs = -1
            await log.js.update_stream(stream)
            # The harnesses ended: the runtime records each finish while the proxy is away.
            await log.append_many(
                [ExecutionFinished(execution_id=e, status="completed", score=1.0) for e in EXECUTIONS]
            )
            gw = Gateway(gw_cfg, event_log=log)
            await gw.start()  # drains what the last run left
            try:
                await gw.recorder.flush()
            finally:
                await gw.stop()
        order = [s.type_name async for s in log.read()]
        assert order == ["execution-dispatched"] * 2 + ["execution-finished"] * 2 + ["model-call-recorded"] * 6

        await catch_up(ProjectionRunner(TrainerProjection(), log, engine))
        with engine.connect() as c:
            assert list(c.execute(select(DeadLetter.reason))) == []
        store = TrainerStore(engine)
        for eid in EXECUTIONS:
            row = store.execution(eid)
            assert row is not None and (row["status"], row["n_calls"]) == ("completed", 3)
            tree = store.tree(eid, await store.fetch_payloads(log, [eid]))
            assert sorted(tree.nodes) == sorted(answered[eid])
        assert [sorted(o.execution_id for o in g.outcomes) for g in store.ready_groups()] == [list(EXECUTIONS)]
    finally:
        await log.close()
        nats.stop()
