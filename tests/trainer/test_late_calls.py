"""Calls the proxy answered before their execution finished but handed to the log after its finish (the log
refused them, the proxy was SIGKILLed with them in its outbox, the runtime appended the finish meanwhile) are
applied by the trainer's projection like every other answered call: counted, answered == applied."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from nats.js.api import DiscardPolicy, StorageType, StreamConfig
from sqlalchemy import Engine, select

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.projection import ProjectionRunner
from opengyre.proxy.engine import EngineConfig, EngineServer
from opengyre.store import DeadLetter
from opengyre.trainer import TrainerProjection, TrainerStore

from .._polling import await_until
from ..proxy import test_recorder, test_recorder_crash
from ._events import catch_up

M = "opengyre-tiny"
EXECUTIONS = ("late-0", "late-1")


@pytest.mark.slow
async def test_calls_drained_after_their_executions_finish_are_applied(tmp_path: Path, engine: Engine) -> None:
    nats = test_recorder.Nats(tmp_path / "nats")
    cfg = LogConfig(stream="LATE", prefix="late.ev", blob_bucket="LATEB")
    log = await EventLog.connect(nats.url, cfg, create=False)
    # The stream takes the two dispatches, then refuses: every answered call waits in the proxy's outbox.
    stream = StreamConfig(
        name=cfg.stream, subjects=[cfg.all_subjects], storage=StorageType.FILE, max_msgs=2, discard=DiscardPolicy.NEW
    )
    await log.js.add_stream(stream)
    await log.append_many(
        [ExecutionDispatched(execution_id=e, task_id="t", group_id="g", group_size=2) for e in EXECUTIONS]
    )
    answered: dict[str, list[str]] = {e: [] for e in EXECUTIONS}
    try:
        async with EngineServer(EngineConfig(port=0)) as srv:
            proxy = test_recorder_crash.Proxy(nats, cfg, srv.url, tmp_path / "outbox.sqlite3")
            try:
                await proxy.start()
                for eid in EXECUTIONS:  # each harness: three turns, each extending the last
                    client = openai.AsyncOpenAI(base_url=f"{proxy.url}/x/{eid}/v1", api_key="any", max_retries=0)
                    msgs: list[dict[str, object]] = [{"role": "user", "content": f"task {eid}"}]
                    for _ in range(3):
                        r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
                        answered[eid].append(r.id.removeprefix("chatcmpl-"))
                        msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "go"}]
                assert await proxy.metric("opengyre_proxy_outbox_events") == 6
                proxy.sigkill()
                stream.max_msgs = -1
                await log.js.update_stream(stream)
                # The harnesses ended: the runtime records each finish while the proxy is still down.
                await log.append_many(
                    [ExecutionFinished(execution_id=e, status="completed", score=1.0) for e in EXECUTIONS]
                )
                await proxy.start()

                async def drained() -> bool:
                    return await proxy.metric("opengyre_proxy_outbox_events") == 0

                await await_until(drained, "the restarted proxy drained its outbox")
            finally:
                if proxy.proc is not None and proxy.proc.poll() is None:
                    proxy.sigkill()
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
            assert sorted(n.call_id for n in tree.nodes.values()) == sorted(answered[eid])
        assert [sorted(o.execution_id for o in g.outcomes) for g in store.ready_groups()] == [list(EXECUTIONS)]
    finally:
        await log.close()
        nats.server.stop()
