"""Bytes on disk per recorded token: the pre-retention layout against token payloads stored once, and after
retention compacted them.

    .venv/bin/python bench/storage_bench.py                       # 8 executions x 10 turns (~10 min, 2 cores)
    .venv/bin/python bench/storage_bench.py --executions 4 --turns 4  # a quick look
    .venv/bin/python bench/storage_bench.py --executions 4 --turns 16 --max-tokens 6 --tool-bytes 0-0  # short calls

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
* **compacted**: a step consumes every execution and retention (horizon 0) deletes their payloads;
* **every field**: the log the gateway wrote, again, each body as the encoder wrote it before model-call events
  left out their defaults (same headers), for the per-call split: each part of a model call's bytes in the log and
  the payload stream (JetStream's per-message record, subject, headers, event body; payload envelope and body),
  read message by message, fixed (per call) or growing with the tokens (the payload body). One event as stored is
  printed to stderr.

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

from opengyre.engine import EngineConfig, EngineServer
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


class Shape(msgspec.Struct, frozen=True):
    """What each call adds: at most ``max_tokens`` generated, a tool result of ``tool_bytes`` (lo, hi) bytes (the
    shipped tokenizer is byte-level: a byte is a token); ``(0, 0)``: a short user turn instead (an SDK call)."""

    max_tokens: int = 48
    tool_bytes: tuple[int, int] = (200, 1500)


def _tool_output(rng: random.Random, texts: list[str], shape: Shape) -> str:
    lo, hi = shape.tool_bytes
    if hi == 0:
        return "ok"
    text = rng.choice(texts)
    n = rng.randint(lo, hi)
    start = rng.randrange(0, max(1, len(text) - n))
    return "tool output:\n" + text[start : start + n]


async def _execution(gw: Gateway, eid: str, turns: int, rng: random.Random, texts: list[str], shape: Shape) -> None:
    client = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key=gw.issue_key(eid), max_retries=0)
    msgs: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools; answer briefly."},
        {"role": "user", "content": f"Task {eid}: find why the tests fail and fix it."},
    ]
    n = shape.max_tokens
    for turn in range(turns):
        r = await client.chat.completions.create(model=M, messages=msgs, max_tokens=n, temperature=1.0)  # type: ignore[arg-type]
        if turn == turns // 2:  # a retried call: a sibling of the last one
            await client.chat.completions.create(model=M, messages=msgs, max_tokens=n, temperature=1.0)  # type: ignore[arg-type]
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content or ""},
            {"role": "user", "content": _tool_output(rng, texts, shape)},
        ]
    sub = openai.AsyncOpenAI(base_url=gw.base_url(eid), api_key=gw.issue_key(eid, "sub-agent"), max_retries=0)
    await sub.chat.completions.create(
        model=M,
        messages=[{"role": "user", "content": "Summarise:\n" + _tool_output(rng, texts, shape)}],
        max_tokens=n,
        temperature=1.0,
    )


async def record(url: str, cfg: LogConfig, executions: int, turns: int, seed: int, shape: Shape) -> None:
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
                        *(
                            _execution(gw, e, turns, random.Random(f"{seed}:{e}"), texts, shape)
                            for e in ids[group : group + 4]
                        )
                    )
            finally:
                await gw.stop()  # waits until every call is in the log
        await log.append_many([ExecutionFinished(execution_id=e, status="completed", score=rng.random()) for e in ids])
    finally:
        await log.close()


def _every_field(e: Event) -> dict[str, Any]:
    """The event as the encoder wrote it before defaults were omitted: the tag, then every field in order."""
    return {"type": e.type_name(), **{f: msgspec.to_builtins(getattr(e, f)) for f in e.__struct_fields__}}


def _body_as_before(e: Event) -> bytes:
    """The JSON the former recorder wrote: the same fields in the same order, without the v2 ``payload``."""
    raw = _every_field(e)
    raw.pop("payload", None)
    return msgspec.json.encode(raw)


async def rewrite_every_field(url: str, after: LogConfig, dst_cfg: LogConfig) -> None:
    """The log the gateway wrote, again, with each body as the encoder wrote it before this change (every field,
    defaults included) and the same headers: the envelope's baseline, in the same process."""
    src = await EventLog.connect(url, after)
    dst = await EventLog.connect(url, dst_cfg)
    try:
        async for stored in src.read():
            raw = await src.js.get_msg(after.stream, stored.seq)
            e = src.decode(stored)
            await dst.js.publish(dst.subject_for(e), msgspec.json.encode(_every_field(e)), headers=raw.headers)
    finally:
        await src.close()
        await dst.close()


def _header_bytes(headers: dict[str, str] | None) -> int:
    """A NATS header block as the server stores it: the ``NATS/1.0`` line, a ``Key: value`` line each, a blank
    line (each line ends in CR LF)."""
    return 12 + sum(len(k) + len(v) + 4 for k, v in headers.items()) if headers else 0


def _payload_header_len(data: bytes) -> int:
    """The payload's own envelope (magic, version, flags and the four length varints) before its body."""
    pos, varints = 5, 0
    while varints < 4:
        varints += data[pos] < 0x80
        pos += 1
    return pos


async def split_per_call(url: str, cfg: LogConfig, *, payloads: bool = True) -> dict[str, float]:
    """Bytes per model call, by part: each stream's JetStream record overhead (its ``state.bytes`` less subjects,
    headers and bodies, per message), subjects, headers, the event body, the payload's envelope, and the payload
    body (ids, logprobs, context: what grows with the tokens). Read from the streams, message by message."""
    log = await EventLog.connect(url, cfg, create=False)
    try:
        parts: dict[str, float] = {}
        streams = [(cfg.stream, "log"), (cfg.payloads, "payload")] if payloads else [(cfg.stream, "log")]
        for stream, label in streams:
            info = await log.js.stream_info(stream)
            first, last = int(info.state.first_seq), int(info.state.last_seq)
            stored = subj = hdr = body = env = calls = 0
            for seq in range(first, last + 1):
                m = await log.js.get_msg(stream, seq)
                data = m.data or b""
                size = (len(m.subject or ""), _header_bytes(m.headers), len(data))
                stored += sum(size)
                if label == "log" and (m.headers or {}).get(TYPE_HEADER) != ModelCallRecorded.type_name():
                    continue  # per execution, not per call
                calls += 1
                if label == "log" and calls == 1:
                    print(f"{cfg.stream}: a model-call event as stored: {data.decode()}", file=sys.stderr)
                subj, hdr = subj + size[0], hdr + size[1]
                if label == "payload":
                    env += _payload_header_len(data)
                    body += len(data) - _payload_header_len(data)
                else:
                    body += len(data)
            n_msgs = last - first + 1
            overhead = (int(info.state.bytes) - stored) / n_msgs if n_msgs else 0.0
            parts[f"{label}: JetStream record"] = overhead * calls
            parts[f"{label}: subject"] = subj
            parts[f"{label}: headers"] = hdr
            if label == "payload":
                parts["payload: envelope (magic, lengths)"] = env
                parts["payload: body (ids, logprobs, context)"] = body
            else:
                parts["log: event body"] = body
        return parts
    finally:
        await log.close()


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
    ap.add_argument("--max-tokens", type=int, default=48, help="generated tokens per call at most")
    ap.add_argument(
        "--tool-bytes", default="200-1500", help="LO-HI bytes of tool output per turn; 0-0: a short user turn"
    )
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.tool_bytes.split("-"))
    shape = Shape(args.max_tokens, (lo, hi))
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        nats = EmbeddedNats(t / "nats")
        url = nats.start()
        try:
            after = LogConfig(stream="AFTER", prefix="after.ev", blob_bucket="AFTER_BLOBS")
            before = LogConfig(stream="BEFORE", prefix="before.ev", blob_bucket="BEFORE_BLOBS")
            t0 = time.perf_counter()
            await record(url, after, args.executions, args.turns, args.seed, shape)
            print(f"recorded in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            await rewrite_inline(url, after, before)
            every_field = LogConfig(stream="EVERYFIELD", prefix="every.ev", blob_bucket="EVERY_BLOBS")
            await rewrite_every_field(url, after, every_field)
            split_new = await split_per_call(url, after)
            split_old = await split_per_call(url, every_field, payloads=False)
            split_old.update({k: v for k, v in split_new.items() if k.startswith("payload")})  # the same stream
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
    print(
        "\nPer model call, by part (bytes; 'every field' = the same log with each body as the encoder wrote it "
        "before defaults were omitted, same headers):\n"
    )
    print("| part | every field B/call | this encoding B/call | grows with tokens |\n| --- | --- | --- | --- |")
    fixed = {"old": 0.0, "new": 0.0}
    for part in split_new:
        per_token = part.startswith("payload: body")
        o, w = split_old[part] / n_calls, split_new[part] / n_calls
        if not per_token:
            fixed["old"] += o
            fixed["new"] += w
        print(f"| {part} | {o:.1f} | {w:.1f} | {'yes' if per_token else 'no'} |")
    body = split_new["payload: body (ids, logprobs, context)"]
    print(f"| **fixed per call** | **{fixed['old']:.1f}** | **{fixed['new']:.1f}** | |")
    old_total = fixed["old"] * n_calls + body
    new_total = fixed["new"] * n_calls + body
    print(
        f"\nlog + payloads, model calls only: every field {old_total / tokens:.2f} B/token, this encoding "
        f"{new_total / tokens:.2f} B/token (ratio {new_total / old_total:.3f}); per token of the payload body "
        f"{body / tokens:.2f} B; {tokens / n_calls:.0f} tokens per call"
    )
    print("\n| encoding | bytes per token, these calls | a 151k vocabulary (Zipf ids) |\n| --- | --- | --- |")
    print("\n".join(codecs))
    print(
        f"\nreading every tree as the trainer does (best of 3): inline rows {read_before * 1e3:.0f} ms, "
        f"rows + payloads by reference {read_after * 1e3:.0f} ms, ratio {read_after / read_before:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
