"""The whole loop with the real gateway: a harness talks OpenAI to the proxy, the proxy records token-in/
token-out calls, the trainer's projection accepts every one, a step trains on them, the engine hot-reloads, and
the next recorded call carries the new weight version."""

from __future__ import annotations

from pathlib import Path

import openai
from sqlalchemy import Engine, select, text

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded
from opengyre.projection import ProjectionRunner
from opengyre.proxy import Gateway, GatewayConfig
from opengyre.store import DeadLetter
from opengyre.trainer import OnlineTrainer, TrainerConfig, TrainerProjection, TrainerStore
from opengyre.trajectory import TrajectoryTree, resolve_calls

from ._events import folding


async def recorded(log: EventLog) -> list[ModelCallRecorded]:
    out = []
    async for s in log.read():
        if s.type_name == "model-call-recorded":
            e = log.decode(s)
            assert isinstance(e, ModelCallRecorded)
            out.append(e)
    return out


async def test_harness_calls_through_the_proxy_train_the_policy(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    runner = ProjectionRunner(TrainerProjection(), event_log, engine)
    async with EngineServer(EngineConfig(preset="tiny", port=0)) as srv, folding(runner):
        gw = Gateway(GatewayConfig(), event_log=event_log)
        await gw.start()
        await gw.pool.add("e0", srv.url)
        try:
            await event_log.append_many(
                [ExecutionDispatched(execution_id=f"x{i}", task_id="t", group_id="g", group_size=2) for i in range(2)]
            )
            clients = {}
            for i in range(2):
                eid = f"x{i}"
                client = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key=gw.issue_key(eid), max_retries=0)
                clients[eid] = client
                msgs: list[dict[str, str]] = [{"role": "user", "content": f"task {i}"}]
                first = await client.chat.completions.create(model="opengyre-tiny", messages=msgs, max_tokens=6)  # type: ignore[arg-type]
                msgs += [
                    {"role": "assistant", "content": first.choices[0].message.content or ""},
                    {"role": "user", "content": "go on"},
                ]
                await client.chat.completions.create(model="opengyre-tiny", messages=msgs, max_tokens=6)  # type: ignore[arg-type]
                await client.chat.completions.create(model="opengyre-tiny", messages=msgs[:1], max_tokens=6)  # type: ignore[arg-type]  # a retry: a sibling
            await gw.recorder.flush()
            await event_log.append_many(
                [
                    ExecutionFinished(execution_id="x0", status="completed", score=1.0),
                    ExecutionFinished(execution_id="x1", status="timed-out", score=0.25),
                ]
            )
            await runner.wait_caught_up(60)
            with engine.connect() as c:
                assert list(c.execute(select(DeadLetter.reason))) == []  # every proxy-recorded call fits the tree
            store = TrainerStore(engine)
            # The trainer's rows refer to the payloads the proxy stored once; it reads them by reference.
            with engine.connect() as c:
                assert set(c.execute(text("SELECT prompt_delta, output_logprobs FROM trainer_calls"))) == {(b"", b"")}
            tree = store.tree("x0", await store.fetch_payloads(event_log, ["x0"]))
            assert len(tree) == 3 and len(tree.leaves()) == 2  # extension + retry branch
            # ... and trains on exactly the recorded ids and behaviour logprobs.
            live = TrajectoryTree(
                "x0", [e for e in await resolve_calls(event_log, await recorded(event_log)) if e.execution_id == "x0"]
            )
            assert [tree.path_sequence(leaf) for leaf in tree.leaves()] == [
                live.path_sequence(leaf) for leaf in live.leaves()
            ]
            cfg = TrainerConfig(
                model="tiny", algorithm="gspo", group_size=2, lr=1e-3, checkpoint_dir=tmp_path, engines=[srv.url]
            )
            report = await OnlineTrainer(cfg, store, event_log).step_once()
            assert report is not None and sorted(report.completed.execution_ids) == ["x0", "x1"]
            assert [r.success for r in report.reloads] == [True]

            await clients["x0"].chat.completions.create(
                model="opengyre-tiny", messages=[{"role": "user", "content": "again"}], max_tokens=4
            )
            await gw.recorder.flush()
            calls = await recorded(event_log)
            assert {c.weight_version for c in calls[:-1]} == {"default"} and calls[-1].weight_version == "default-s1"
        finally:
            await gw.stop()
