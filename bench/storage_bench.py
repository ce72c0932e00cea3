"""Bytes on disk per recorded token: the pre-retention layout against token payloads stored once, and after
retention compacted them.

    .venv/bin/python bench/storage_bench.py                       # 8 executions x 10 turns (~10 min, 2 cores)
    .venv/bin/python bench/storage_bench.py --executions 4 --turns 4  # a quick look

Recording goes through the real gateway (the ``openai`` SDK as the harness, the built-in CPU engine, an
embedded nats-server with file storage): growing multi-turn executions whose every turn adds the model's reply
and a tool result (slices of this repository's source, 200-1,500 bytes), with an occasional retried call and a
sub-agent. The scheduler's ``execution-dispatched`` and ``execution-finished`` are appended around them. Then,
in the same process and for exactly the same calls:

* **after** (this code): the log the gateway wrote (events refer to payloads) and the payload stream; the proxy's
  and the trainer's projections folded from it, each into its own SQLite file;
* **before** (the layout up to this change): the same calls re-appended with their tokens and context inline, as
  the recorder wrote them (same headers, same JSON; contexts over 64 KiB to the object store), folded into two
  other SQLite files by the same projections (which still store inline calls as they did: int32 ids, float64
  logprobs in the proxy's store, float32 in the trainer's);
* **compacted**: a step consumes every execution and retention (horizon 0) deletes their payloads.

Log and payload bytes are JetStream's own accounting of each stream (``state.bytes``: subjects, headers, bodies
and per-message overhead); the stream's ``.blk`` files on disk are printed beside. SQLite bytes are each file's
size after a checkpoint and ``VACUUM``. Tokens are the recorded ones (prompt deltas + outputs, what the tree
stores). It also times reading every execution's tree the way the trainer does (rows, plus payloads by
reference after), as a ratio against the inline rows, in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sqlite3
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import openai
from nats.js.api import Header
from sqlalchemy import Engine

from opengyre.eventlog import TYPE_HEADER, EventLog, LogConfig
from opengyre.events import (
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TrainingStepCompleted,
)
from opengyre.projection import Projection, replay_into
from opengyre.proxy import Gateway, GatewayConfig, TrajectoryProjection
from opengyre.proxy.engine import EngineConfig, EngineServer
from opengyre.runtime import EmbeddedNats
from opengyre.store import create_db_engine, migrate
from opengyre.trainer import RetentionPolicy, TrainerProjection, TrainerStore, compact
from opengyre.trajectory import TokenPayload, encode_payload, resolve_calls

ROOT = Path(__file__).resolve().parents[1]
M = "opengyre-tiny"
OLD_INLINE_CONTEXT = 64 * 1024  # the recorder's former limit for contexts inside the event


def _tool_texts(rng: random.Random) -> list[str]:
    sources = sorted((ROOT / "libs" / "opengyre").rglob("*.py")) + sorted((ROOT / "svc-proxy").rglob("*.py"))
    return [p.read_text(errors="replace") for p in sources if p.stat().st_size > 2000]


def _tool_output(rng: random.Random, texts: list[str]) -> str:
    text = rng.choice(texts)
    n = rng.randint(200, 1500)
    start = rng.randrange(0, max(1, len(text) - n))
    return text[start : start + n]


async def _execution(gw: Gateway, eid: str, turns: int, rng: random.Random, texts: list[str]) -> None:
    client = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key=gw.issue_key(eid), max_retries=0)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools; answer briefly."},
        {"role": "user", "content": f"Task {eid}: find why the tests fail and fix it."},
    ]
    for turn in range(turns):
        r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=48, temperature=1.0)  # type: ignore[arg-type]
        if turn == turns // 2:  # a retried call: a sibling of the last one
            await client.chat.completions.create(model=M, messages=msgs, max_tokens=48, temperature=1.0)  # type: ignore[arg-type]
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content or ""},
            {"role": "user", "content": "tool output:\n" + _tool_output(rng, texts)},
        ]
    sub = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key=gw.issue_key(eid, "sub-agent"), max_retries=0)
    await sub.chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "Summarise:\n" + _tool_output(rng, texts)}],
        max_tokens=48,
        temperature=1.0,
    )


async def record(url: str, cfg: LogConfig, executions: int, turns: int, seed: int) -> None:
    rng = random.Random(seed)
    texts = _tool_texts(rng)
    log = await EventLog.connect(url, cfg)
    try:
        ids = [f"ex-{i:03d}" for i in range(executions)]
        await log.append_many(
            [ExecutionDispatched(execution_id=e, task_id=f"task-{e}", group_id="g", group_size=executions) for e in ids]
        )
        async with EngineServer(EngineConfig(preset="tiny", port=0, seed=seed)) as engine:
            gw = Gateway(GatewayConfig(), event_log=log)
            await gw.start()
            await gw.pool.add("e0", engine.url)
            try:
                for group in range(0, executions, 4):  # four harnesses at a time
                    await asyncio.gather(
                        *(_execution(gw, e, turns, random.Random(f"{seed}:{e}"), texts) for e in ids[group : group + 4])
                    )
            finally:
                await gw.stop()  # waits until every call is in the log
        await log.append_many([ExecutionFinished(execution_id=e, status="completed", score=rng.random()) for e in ids])
    finally:
        await log.close()


def _body_as_before(e: Event) -> bytes:
    """The JSON the former recorder wrote: the same fields in the same order, without the v2 ``payload``."""
    raw = msgspec.to_builtins(e)
    raw.pop("payload", None)
    return msgspec.json.encode(raw)


async def rewrite_inline(url: str, after: LogConfig, before: LogConfig) -> None:
    """Append the same events to another stream in the pre-retention layout (tokens and context inline)."""
    src = await EventLog.connect(url, after)
    dst = await EventLog.connect(url, before)
    try:
        stored = [s async for s in src.read()]
        events = [src.decode(s) for s in stored]
        calls = [e for e in events if isinstance(e, ModelCallRecorded)]
        whole = iter(await resolve_calls(src, calls))
        for e in events:
            if isinstance(e, ModelCallRecorded):
                e = msgspec.structs.replace(next(whole), payload=None)
                ctx = msgspec.json.encode(e.context)
                if e.context is not None and len(ctx) > OLD_INLINE_CONTEXT:
                    ref = await dst.put_blob(f"ctx-{e.execution_id}-{e.call_id}", ctx)
                    e = msgspec.structs.replace(e, context=None, context_ref=ref)
            headers = {Header.MSG_ID: e.event_id, TYPE_HEADER: e.type_name()}  # v1: no version header
            await dst.js.publish(dst.subject_for(e), _body_as_before(e), headers=headers)
    finally:
        await src.close()
        await dst.close()


async def fold(url: str, cfg: LogConfig, projection: Projection, path: Path) -> Engine:
    engine = create_db_engine(f"sqlite:///{path}")
    migrate(engine)
    log = await EventLog.connect(url, cfg)
    try:
        await replay_into(projection, log, engine)
    finally:
        await log.close()
    return engine


def sqlite_bytes(path: Path, tables: list[str]) -> int:
    """Pages the projection's tables, their indexes and its tracking rows occupy (after VACUUM): the file less
    the empty tables every service's migrations create in it."""
    with sqlite3.connect(path) as c:
        c.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        c.execute("VACUUM")
        owned = [*tables, "og_tracking"]
        marks = ",".join("?" * len(owned))
        names = [r[0] for r in c.execute(f"SELECT name FROM sqlite_master WHERE tbl_name IN ({marks})", owned)]
        marks = ",".join("?" * len(names))
        return int(
            c.execute(f"SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name IN ({marks})", names).fetchone()[0]
        )


async def stream_bytes(log: EventLog, name: str, store: Path) -> tuple[int, int]:
    """(JetStream's byte count of the stream, bytes of its block files on disk)."""
    try:
        info = await log.js.stream_info(name)
    except Exception:
        return 0, 0
    blocks = sum(p.stat().st_size for p in store.rglob(f"streams/{name}/msgs/*.blk"))
    return int(info.state.bytes), blocks


async def measure(
    url: str, cfg: LogConfig, store: Path, dbs: dict[str, tuple[Path, list[str]]]
) -> dict[str, tuple[int, int]]:
    log = await EventLog.connect(url, cfg, create=False)
    try:
        out = {
            "log (event stream)": await stream_bytes(log, cfg.stream, store),
            "payload stream": await stream_bytes(log, cfg.payloads, store),
            "object store (large contexts)": await stream_bytes(log, f"OBJ_{cfg.blob_bucket}", store),
        }
    finally:
        await log.close()
    for name, (path, tables) in dbs.items():
        size = sqlite_bytes(path, tables)
        out[name] = (size, size)
    return out


async def tokens_and_calls(url: str, cfg: LogConfig) -> tuple[int, int, int]:
    log = await EventLog.connect(url, cfg, create=False)
    try:
        calls = [e async for _, e in log.events(ModelCallRecorded)]
    finally:
        await log.close()
    recorded = sum(e.n_prompt_delta + e.n_output for e in calls)
    return recorded, sum(e.n_output for e in calls), len(calls)


def codec_table(calls: list[ModelCallRecorded], seed: int) -> list[str]:
    """Bytes per token of each encoding choice, over the recorded calls (ids: prompt deltas and outputs;
    logprobs: per generated token) and, for ids, a Zipf draw over a 151,643-token vocabulary (Qwen's size; the
    shipped tokenizer is byte-level, so its ids are all below 265)."""
    rows = []
    ids = [list(e.prompt_delta_ids) + list(e.output_ids) for e in calls]
    n_ids = sum(map(len, ids))
    rng = np.random.default_rng(seed)
    zipf = [np.minimum(rng.zipf(1.1, len(x)), 151_642).tolist() for x in ids]
    lps = [list(e.output_logprobs) for e in calls]
    n_lp = sum(map(len, lps))
    id_codecs: dict[str, Any] = {
        "JSON (the event before)": lambda x: msgspec.json.encode(x),
        "int32 (the stores before)": lambda x: np.asarray(x, "<i4").tobytes(),
        "varint (a payload of the ids alone, uncompressed)": lambda x: encode_payload(
            TokenPayload(x, [], []), compress=False
        ),
        "varint, zlib where it pays (the payload codec)": lambda x: encode_payload(TokenPayload(x, [], [])),
    }
    for name, f in id_codecs.items():
        here = sum(len(f(x)) for x in ids) / n_ids
        qwen = sum(len(f(x)) for x in zipf) / n_ids
        rows.append(f"| token ids: {name} | {here:.2f} | {qwen:.2f} |")
    lp_codecs: dict[str, Any] = {
        "JSON (the event before)": lambda x: msgspec.json.encode(x),
        "float64 (the proxy's store before)": lambda x: np.asarray(x, "<f8").tobytes(),
        "float32": lambda x: np.asarray(x, "<f4").tobytes(),
        "float32 + zlib": lambda x: zlib.compress(np.asarray(x, "<f4").tobytes(), 6),
    }
    for name, f in lp_codecs.items():
        rows.append(f"| logprobs: {name} | {sum(len(f(x)) for x in lps) / n_lp:.2f} per generated token | |")
    return rows


async def read_trees(url: str, cfg: LogConfig, engine: Engine, ids: list[str], by_ref: bool) -> float:
    """Seconds to build every execution's tree as the trainer does (best of 3)."""
    store = TrainerStore(engine)
    log = await EventLog.connect(url, cfg, create=False)
    best = float("inf")
    try:
        for _ in range(3):
            t0 = time.perf_counter()
            fetched = await store.fetch_payloads(log, ids) if by_ref else None
            for e in ids:
                store.tree(e, fetched)
            best = min(best, time.perf_counter() - t0)
    finally:
        await log.close()
    return best


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--executions", type=int, default=8)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        try:
            after = LogConfig(stream="AFTER", prefix="after.ev", blob_bucket="AFTER_BLOBS")
            before = LogConfig(stream="BEFORE", prefix="before.ev", blob_bucket="BEFORE_BLOBS")
            t0 = time.perf_counter()
            await record(url, after, args.executions, args.turns, args.seed)
            print(f"recorded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            await rewrite_inline(url, after, before)
            dbs: dict[str, dict[str, tuple[Path, list[str]]]] = {}
            engines: dict[str, Engine] = {}
            proxy_tables = [t_.name for t_ in TrajectoryProjection().tables]
            trainer_tables = [t_.name for t_ in TrainerProjection().tables]
            for label, cfg in (("before", before), ("after", after)):
                dbs[label] = {
                    "proxy store": (t / f"{label}-proxy.db", proxy_tables),
                    "trainer store": (t / f"{label}-trainer.db", trainer_tables),
                }
                await fold(url, cfg, TrajectoryProjection(), dbs[label]["proxy store"][0])
                engines[label] = await fold(url, cfg, TrainerProjection(), dbs[label]["trainer store"][0])
            tokens, outputs, n_calls = await tokens_and_calls(url, after)
            log = await EventLog.connect(url, after, create=False)
            try:
                whole = await resolve_calls(log, [e async for _, e in log.events(ModelCallRecorded)])
            finally:
                await log.close()
            codecs = codec_table(whole, args.seed)
            assert (tokens, outputs, n_calls) == await tokens_and_calls(url, before)
            ids = [f"ex-{i:03d}" for i in range(args.executions)]
            read_before = await read_trees(url, before, engines["before"], ids, by_ref=False)
            read_after = await read_trees(url, after, engines["after"], ids, by_ref=True)
            sizes = {
                label: await measure(url, cfg, t / "nats", dbs[label])
                for label, cfg in (("before", before), ("after", after))
            }

            # Retention: one step consumes every execution; horizon 0 compacts them all.
            log = await EventLog.connect(url, after)
            try:
                await log.append(
                    TrainingStepCompleted(
                        step=1, weight_version="v1", loss=0.0, n_samples=0, n_tokens=0, execution_ids=ids
                    )
                )
            finally:
                await log.close()
            t_db = engines["after"]
            log = await EventLog.connect(url, after)
            try:
                await replay_into(TrainerProjection(), log, t_db)
                done = await compact(TrainerStore(t_db), log, RetentionPolicy(retain_steps=0))
                assert len(done) == len(ids)
            finally:
                await log.close()
            for e in engines.values():
                e.dispose()
            for key, projection in (("proxy store", TrajectoryProjection()), ("trainer store", TrainerProjection())):
                (await fold(url, after, projection, dbs["after"][key][0])).dispose()
            sizes["compacted"] = await measure(url, after, t / "nats", dbs["after"])
        finally:
            nats.stop()

    print(
        f"\n{args.executions} executions x {args.turns} turns: {n_calls} recorded calls, {tokens:,} recorded tokens "
        f"({outputs:,} generated), {tokens / n_calls:.0f} tokens per call\n"
    )
    print("| component | before B/token | after B/token | after / before | compacted B/token | compacted / before |")
    print("| --- | --- | --- | --- | --- | --- |")
    totals = {k: 0 for k in sizes}
    for comp in sizes["before"]:
        b, a, c = (sizes[k][comp][0] for k in ("before", "after", "compacted"))
        for k, v in (("before", b), ("after", a), ("compacted", c)):
            totals[k] += v
        ratio = f"{a / b:.3f}" if b else "—"
        cratio = f"{c / b:.3f}" if b else "—"
        print(f"| {comp} | {b / tokens:.2f} | {a / tokens:.2f} | {ratio} | {c / tokens:.2f} | {cratio} |")
    b, a, c = totals["before"], totals["after"], totals["compacted"]
    print(
        f"| **total** | **{b / tokens:.2f}** | **{a / tokens:.2f}** | **{a / b:.3f}** | **{c / tokens:.2f}** | **{c / b:.3f}** |"
    )
    print(
        f"\nper recorded call: before {b / n_calls:,.0f} B, after {a / n_calls:,.0f} B, compacted {c / n_calls:,.0f} B"
    )
    print(
        "stream block files on disk (bytes): "
        + ", ".join(f"{k} {sum(v[1] for n, v in sizes[k].items() if 'stream' in n or 'store (' in n):,}" for k in sizes)
    )
    print("\n| encoding | bytes per token, these calls | a 151k vocabulary (Zipf ids) |\n| --- | --- | --- |")
    print("\n".join(codecs))
    print(
        f"\nreading every tree as the trainer does (best of 3): inline rows {read_before * 1e3:.0f} ms, "
        f"rows + payloads by reference {read_after * 1e3:.0f} ms, ratio {read_after / read_before:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
