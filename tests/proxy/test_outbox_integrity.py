"""The outbox is the proxy's alone: rows someone else wrote into the file are quarantined, never published.

A forged row (no integrity tag, a wrong one, a valid one for an execution the proxy never recorded, one put after
its execution's seal) goes to ``outbox_quarantine`` with its reason and is counted on ``/metrics``; the real rows
around it are all published exactly once. The file and its folder are private (0600 / 0700), an older build's
file included, and an older build's untagged rows are adopted, not lost.
"""

from __future__ import annotations

import os
import re
import sqlite3
import stat
from pathlib import Path

import httpx
import openai
import pytest
from sqlalchemy import Engine

from opengyre.engine import EngineServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionFinished, ModelCallRecorded, default_registry
from opengyre.projection import replay_into
from opengyre.proxy import TrajectoryProjection
from opengyre.proxy._keys import load_or_create_secret
from opengyre.proxy.recording._outbox import Outbox, outbox_key, row_tag
from opengyre.proxy.recording._recorder import Recorder
from opengyre.proxy.recording._store import SealedFinishes

from .._polling import await_until
from .test_recorder import Nats, assert_exactly_once_in_order
from .test_recorder_crash import Proxy, narrowed_stream

M = "opengyre-tiny"
LIMIT = 4  # the stream takes this many events, then refuses: the rest stay in the outbox file


def _forged(execution_id: str, call_id: str) -> ModelCallRecorded:
    return ModelCallRecorded(
        execution_id=execution_id, call_id=call_id, prompt_delta_ids=[1, 2], output_ids=[3], output_logprobs=[-0.1]
    )


def _insert(path: Path, row: int, e: ModelCallRecorded, tag: bytes | None) -> None:
    """Write a row into the outbox file the way another process with access to it could."""
    body = default_registry().encode(e)
    with sqlite3.connect(path) as db:
        db.execute(
            "INSERT INTO outbox (id, event_id, type_name, version, body, execution_id, tag) VALUES (?,?,?,?,?,?,?)",
            (row, e.event_id, e.type_name(), e.version, body, e.execution_id, tag),
        )


def _valid_tag(path: Path, row: int, e: ModelCallRecorded) -> bytes:
    """The tag the proxy itself would compute (as if its key had leaked): only the execution check is left."""
    key = outbox_key(load_or_create_secret(path.parent / "proxy.secret"))
    return row_tag(key, row, e.event_id, e.type_name(), e.version, e.execution_id, default_registry().encode(e))


def _quarantine(path: Path) -> list[tuple[str, str]]:
    with sqlite3.connect(path) as db:
        return sorted(db.execute("SELECT event_id, reason FROM outbox_quarantine"))


async def _quarantined_metric(url: str) -> dict[str, float]:
    async with httpx.AsyncClient() as c:
        text = (await c.get(url + "/metrics")).text
    pattern = r'^opengyre_proxy_outbox_quarantined_total\{reason="([a-z-]+)"\} (\S+)$'
    return {m[1]: float(m[2]) for m in re.finditer(pattern, text, re.MULTILINE)}


@pytest.mark.slow
async def test_forged_rows_are_quarantined_after_a_restart_and_every_real_row_is_published_once(
    tmp_path: Path, engine_a: EngineServer
) -> None:
    nats = Nats(tmp_path / "nats")
    cfg = LogConfig(stream="FORGE", prefix="forge.ev", blob_bucket="FORGEB")
    log = await EventLog.connect(nats.url, cfg)
    stream = await narrowed_stream(log, cfg, LIMIT)
    outbox = tmp_path / "outbox.sqlite3"
    proxy = Proxy(nats, cfg, engine_a.url, outbox)
    try:
        await proxy.start()
        answered: list[str] = []
        for eid in ("ex-0", "ex-1"):
            msgs = [{"role": "user", "content": f"hello {eid}"}]
            client = openai.AsyncOpenAI(base_url=f"{proxy.url}/x/{eid}/v1", api_key="any", max_retries=0)
            for _ in range(4):
                r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=3)  # type: ignore[arg-type]
                answered.append(r.id.removeprefix("chatcmpl-"))
                msgs += [r.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]

        async def stuck() -> bool:
            return (await log.js.stream_info(cfg.stream)).state.messages == LIMIT and await proxy.metric(
                "opengyre_proxy_outbox_events"
            ) == len(answered) - LIMIT

        await await_until(stuck, "the proxy drained up to the stream's limit")
        proxy.sigkill()  # 4 real calls are only in the outbox file now

        with sqlite3.connect(outbox) as db:
            (last,) = db.execute("SELECT max(id) FROM outbox").fetchone()
        no_tag, bad_tag, ghost = _forged("ex-0", "forged-a"), _forged("ex-1", "forged-b"), _forged("ghost", "forged-c")
        _insert(outbox, 1, no_tag, None)  # at the head, where drained rows were
        _insert(outbox, last + 1, bad_tag, os.urandom(32))
        _insert(outbox, last + 2, ghost, _valid_tag(outbox, last + 2, ghost))

        await proxy.restart_drained(log, stream)
        events = [e async for _, e in log.events(ModelCallRecorded)]
        assert_exactly_once_in_order(events, answered)  # none of the forged calls, every real one once
        assert _quarantine(outbox) == sorted(
            [(no_tag.event_id, "no-tag"), (bad_tag.event_id, "bad-tag"), (ghost.event_id, "unknown-execution")]
        )
        counts = await _quarantined_metric(proxy.url)
        assert {k: v for k, v in counts.items() if v} == {"no-tag": 1, "bad-tag": 1, "unknown-execution": 1}
    finally:
        if proxy.proc is not None and proxy.proc.poll() is None:
            proxy.sigkill()
        await log.close()
        nats.server.stop()


def _call(execution_id: str, i: int) -> ModelCallRecorded:
    return ModelCallRecorded(
        execution_id=execution_id,
        call_id=f"{execution_id}-c{i}",
        parent_call_id=f"{execution_id}-c{i - 1}" if i else None,
        prompt_delta_ids=[1, 2, 3],
        output_ids=[4],
        output_logprobs=[-0.5],
    )


async def _put(outbox: Outbox, e: ModelCallRecorded) -> None:
    synced = outbox.put(e)
    if synced is not None:
        await synced


async def test_a_row_with_a_valid_tag_put_after_its_executions_seal_is_quarantined(
    event_log: EventLog, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.sqlite3"
    outbox = await Outbox(path).open()
    calls = [_call("sealed", i) for i in range(3)]
    for c in calls:
        await _put(outbox, c)
    await outbox.seal("sealed")
    await outbox.close()
    late = _call("sealed", 3)
    with sqlite3.connect(path) as db:
        (sealed_at,) = db.execute("SELECT sealed_at FROM outbox_executions WHERE execution_id = 'sealed'").fetchone()
    _insert(path, sealed_at, late, _valid_tag(path, sealed_at, late))

    rec = Recorder(event_log, outbox_path=path)
    await rec.start()
    try:
        await rec.flush()
        assert rec.outbox.calls("sealed") == 3
    finally:
        await rec.stop()
    logged = [e.event_id async for _, e in event_log.events(ModelCallRecorded)]
    assert logged == [c.event_id for c in calls]
    assert _quarantine(path) == [(late.event_id, "after-seal")]
    assert dict(rec.outbox.quarantined) == {"after-seal": 1}


async def test_a_row_with_a_valid_tag_for_an_execution_whose_seal_is_in_the_log_is_quarantined(
    event_log: EventLog, tmp_path: Path, engine: Engine
) -> None:
    """The execution's sealed finish is in the log (folded into the proxy's store), its seal pruned from the
    outbox: a row of it found in the file is not one the proxy put."""
    await event_log.append(ExecutionFinished(execution_id="done", status="completed", score=1.0, recorded_calls=2))
    await replay_into(TrajectoryProjection(), event_log, engine)
    path = tmp_path / "outbox.sqlite3"
    outbox = await Outbox(path).open()
    real = _call("running", 0)
    await _put(outbox, real)
    await outbox.close()
    late = _call("done", 2)
    _insert(path, 2, late, _valid_tag(path, 2, late))

    rec = Recorder(event_log, outbox_path=path, sealed=SealedFinishes(engine))
    await rec.start()
    try:
        await rec.flush()
    finally:
        await rec.stop()
    logged = [e.event_id async for _, e in event_log.events(ModelCallRecorded)]
    assert logged == [real.event_id]
    assert _quarantine(path) == [(late.event_id, "sealed-execution")]


_OLD_SCHEMA = (
    "CREATE TABLE outbox (id INTEGER PRIMARY KEY, event_id TEXT NOT NULL UNIQUE, type_name TEXT NOT NULL,"
    " version INTEGER NOT NULL, body BLOB NOT NULL, execution_id TEXT)",
    "CREATE TABLE outbox_executions (execution_id TEXT PRIMARY KEY, calls INTEGER NOT NULL, sealed INTEGER NOT NULL)",
    "CREATE TABLE outbox_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
)


async def test_an_older_builds_untagged_rows_are_adopted_and_published_and_its_file_made_private(
    event_log: EventLog, tmp_path: Path
) -> None:
    """The file a build before tags left behind (0644 in a 0755 folder, as the umask made them): its rows were
    the proxy's, so they are published, each once; the file and the folder are narrowed to 0600 / 0700."""
    folder = tmp_path / "data"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    path = folder / "proxy-outbox.sqlite3"
    calls = [_call("old", i) for i in range(3)]
    reg = default_registry()
    with sqlite3.connect(path) as db:
        for stmt in _OLD_SCHEMA:
            db.execute(stmt)
        for i, c in enumerate(calls, start=1):
            db.execute(
                "INSERT INTO outbox VALUES (?, ?, ?, ?, ?, ?)",
                (i, c.event_id, c.type_name(), c.version, reg.encode(c), c.execution_id),
            )
        db.execute("INSERT INTO outbox_executions VALUES ('old', 3, 0)")
    path.chmod(0o644)

    rec = Recorder(event_log, outbox_path=path)
    await rec.start()
    try:
        await rec.flush()
        assert rec.outbox.adopted == 3
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in folder.iterdir()}
    finally:
        await rec.stop()
    logged = [e.event_id async for _, e in event_log.events(ModelCallRecorded)]
    assert logged == [c.event_id for c in calls]
    assert _quarantine(path) == []
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    names = {"proxy-outbox.sqlite3", "proxy-outbox.sqlite3-wal", "proxy-outbox.sqlite3-shm", "proxy.secret"}
    assert names | {"proxy-outbox.sqlite3.lock"} <= set(modes)
    assert modes == dict.fromkeys(modes, 0o600)


async def test_a_new_outbox_and_the_folder_it_makes_are_private(tmp_path: Path) -> None:
    path = tmp_path / "new" / "outbox.sqlite3"
    outbox = await Outbox(path).open()
    try:
        await _put(outbox, _call("ex", 0))
        modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in path.parent.iterdir()}
    finally:
        await outbox.close()
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert "outbox.sqlite3-wal" in modes
    assert modes == dict.fromkeys(modes, 0o600)
