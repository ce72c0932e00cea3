"""Engines follow the policy: the trainer reloads the engines of rollout cells (from the scheduler's cell
events) after each step, and brings an engine that joins rollout later up to the latest version."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import msgspec
from sqlalchemy import Engine, select

from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.events import CellEngineChanged, CellRegistered, CellRoleChanged, ModelCallRecorded
from opengyre.projection import ProjectionRunner
from opengyre.store import DeadLetter
from opengyre.trainer import (
    OnlineTrainer,
    PublishedCheckpoint,
    TrainerConfig,
    TrainerProjection,
    TrainerStore,
    engine_versions,
    reload_engines,
)

from ._events import folding, group


async def served(url: str) -> str:
    async with httpx.AsyncClient() as c:
        return str((await c.get(url + "/model_info")).json()["weight_version"])


async def test_rollout_engines_are_reloaded_and_late_joiners_synced(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    runner = ProjectionRunner(TrainerProjection(), event_log, engine)
    async with (
        EngineServer(EngineConfig(preset="tiny")) as a,
        EngineServer(EngineConfig(preset="tiny")) as b,
        EngineServer(EngineConfig(preset="tiny")) as c,
        folding(runner),
    ):
        await event_log.append_many(
            [
                CellRegistered(cell_id="c1", role="rollout", engine_url=a.url),
                CellRegistered(cell_id="c2", role="training-core", engine_url=b.url),
                CellRoleChanged(cell_id="ghost", from_role="idle", to_role="rollout"),
                *group("g", [("completed", 1.0, None), ("completed", 0.0, None)]),
            ]
        )
        await runner.wait_caught_up(60)
        store = TrainerStore(engine)
        assert store.rollout_engines() == [a.url]
        cfg = TrainerConfig(model="tiny", algorithm="grpo", group_size=2, lr=1e-3, checkpoint_dir=tmp_path)
        trainer = OnlineTrainer(cfg, store, event_log)
        report = await trainer.step_once()
        assert report is not None and [(r.url, r.success) for r in report.reloads] == [(a.url, True)]
        assert await served(a.url) == "default-s1" and await served(b.url) == "default"

        await runner.wait_caught_up(60)  # the WeightsPublished event is folded: the latest version is known
        assert await trainer.sync_engines() == []  # the training cell's engine is not a rollout engine
        await event_log.append_many(  # back by the role-change protocol: through switching
            [
                CellRoleChanged(cell_id="c2", from_role="training-core", to_role="switching"),
                CellRoleChanged(cell_id="c2", from_role="switching", to_role="rollout"),
            ]
        )
        await runner.wait_caught_up(60)
        synced = await trainer.sync_engines()
        assert [(r.url, r.success) for r in synced] == [(b.url, True)]  # a is current: left alone
        assert await served(b.url) == "default-s1"
        # A cell's engine restarted elsewhere (cell-engine-changed): the new one is a rollout engine, brought up to date.
        await event_log.append(CellEngineChanged(cell_id="c1", engine_url=c.url))
        await event_log.append(CellEngineChanged(cell_id="ghost", engine_url=c.url))  # never registered: rejected
        await runner.wait_caught_up(60)
        assert store.rollout_engines() == sorted([b.url, c.url])
        synced = await trainer.sync_engines()
        assert [(r.url, r.success) for r in synced] == [(c.url, True)]
        assert await served(c.url) == "default-s1" and trainer.engines[c.url].serving == "default-s1"
    with engine.connect() as conn:
        assert [r for (r,) in conn.execute(select(DeadLetter.reason))] == ["unknown-cell", "unknown-cell"]


class _OddEngine(BaseHTTPRequestHandler):
    """An engine (not ours) that answers every route with JSON that is not an object."""

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        body = b'["not", "an", "object"]'
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self._answer()

    def do_POST(self) -> None:
        self._answer()

    def log_message(self, format: str, *args: object) -> None:
        pass


async def test_an_engine_answering_odd_json_is_reported_not_raised(tmp_path: Path) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _OddEngine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert await engine_versions([url]) == {url: None}
        [reload] = await reload_engines([url], PublishedCheckpoint("default-s1", 1, tmp_path, ""))
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert reload.url == url and not reload.success


def _from(events: list, engine_id: str) -> list:  # type: ignore[type-arg]
    """The events with every recorded call stamped as served by ``engine_id``."""
    return [msgspec.structs.replace(e, engine_id=engine_id) if isinstance(e, ModelCallRecorded) else e for e in events]


async def test_calls_from_an_engine_that_failed_to_load_are_not_trained(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    runner = ProjectionRunner(TrainerProjection(), event_log, engine)
    async with (
        EngineServer(EngineConfig(preset="tiny")) as ok,
        EngineServer(EngineConfig(preset="small")) as other,  # another model: it refuses the trainer's weights
        folding(runner),
    ):
        await event_log.append_many(
            [
                CellRegistered(cell_id="c-ok", role="rollout", engine_url=ok.url),
                CellRegistered(cell_id="c-bad", role="rollout", engine_url=other.url),
                *_from(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]), "c-ok"),
            ]
        )
        await runner.wait_caught_up(60)
        cfg = TrainerConfig(
            model="tiny", algorithm="grpo", group_size=2, lr=1e-3, checkpoint_dir=tmp_path, engine_reload_attempts=3
        )
        trainer = OnlineTrainer(cfg, TrainerStore(engine), event_log)
        first = await trainer.step_once()
        assert first is not None
        refused = {r.url: r for r in first.reloads}[other.url]
        assert not refused.success and refused.refused and refused.attempts == 1  # a refusal is not retried
        state = trainer.engines[other.url]
        assert state.failed_version == "default-s1" and state.serving == "default"
        assert trainer.engines[ok.url].serving == "default-s1"
        # After the failure: one group served by the engine that failed, one by the one that loaded.
        await event_log.append_many(
            [
                *_from(group("g2", [("completed", 1.0, None), ("completed", 0.0, None)], seed=2), "c-bad"),
                *_from(group("g3", [("completed", 0.0, None), ("completed", 1.0, None)], seed=3), "c-ok,c-bad"),
                *_from(group("g4", [("completed", 0.5, None), ("completed", 1.0, None)], seed=4), "c-ok"),
            ]
        )
        await runner.wait_caught_up(60)
        trainer.config.groups_per_step = 3
        second = await trainer.step_once()
    assert second is not None
    assert second.completed.dropped == {
        "g2-e0": "excluded:engine-load-failed:c-bad",
        "g2-e1": "excluded:engine-load-failed:c-bad",
        "g3-e0": "excluded:engine-load-failed:c-bad",  # rerouted through it
        "g3-e1": "excluded:engine-load-failed:c-bad",
    }
    assert sorted(second.completed.execution_ids) == ["g4-e0", "g4-e1"]
    m = second.completed.metrics
    assert (m["engines"], m["engines_current"], m["engines_failed"]) == (2.0, 1.0, 1.0)


async def test_a_reload_that_does_not_get_through_is_retried(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    ckpt = PublishedCheckpoint("v1", 1, tmp_path, "")
    [r] = await reload_engines([url], ckpt, attempts=3, backoff_s=0.01)
    assert not r.success and not r.refused and r.attempts == 3
