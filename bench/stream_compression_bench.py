"""Bytes on disk per recorded model call with the streams' S2 block compression against none (issue 24 item 9).

    .venv/bin/python bench/stream_compression_bench.py                 # 28 / 200 / 750 tokens per call (~1 min)
    .venv/bin/python bench/stream_compression_bench.py --calls 4000   # a quick look (blocks barely sealed)

Each model call is what the proxy appends, built by the same code: a ``ModelCallRecorded`` split by
``split_payload`` (``encode_payload``: varint ids, float32 logprobs, the context JSON, zlib where it pays; a
``PayloadRef`` with its SHA-256), the event appended through ``EventLog.append_many`` (its JSON body and
headers) and the payload through ``EventLog.payloads.put_many`` (one message under the execution and digest).
The calls are drawn, not recorded from a model: executions of 16 calls, ids fresh per execution and call (uuid4
hex, as the gateway's), token ids Zipf-ranked over SmolLM2's 49,152 ids (ranks shuffled into ids), logprobs ``-Exp(1)``, the context's
new messages slices of this repository's source at ~4 bytes a token (a BPE tokenizer's rate), timings
drawn per call. Whether this is what a real harness sends matters less than that both layouts get the same
bytes: the same calls (one seed) go to two pairs of streams on one nats-server, one pair with ``compression:
s2``, one with ``none``.

Sizes are the streams' ``.blk`` files on disk after the server stopped (JetStream compresses a block when it
is sealed, so the last, active block of each stream is stored as written): per call over all blocks, and over
the sealed blocks alone (what a long run converges to). The server's CPU time for each pair's writes
(``/proc/<pid>/stat``, utime + stime) is the cost, as a ratio in the same process.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import CallTimings, ModelCallRecorded
from opengyre.runtime import EmbeddedNats
from opengyre.trajectory import split_payload

ROOT = Path(__file__).resolve().parents[1]
VOCAB = 49_152  # SmolLM2's
CALLS_PER_EXECUTION = 16


@dataclass(frozen=True)
class Shape:
    name: str
    prompt_delta: int  # new prompt tokens per call
    output: int  # generated tokens per call

    @property
    def tokens(self) -> int:
        return self.prompt_delta + self.output


SHAPES = (Shape("short SDK call", 22, 6), Shape("agent turn", 176, 24), Shape("long tool result", 700, 50))


def _texts() -> list[str]:
    sources = sorted((ROOT / "libs" / "opengyre").rglob("*.py")) + sorted((ROOT / "svc-proxy").rglob("*.py"))
    return [p.read_text(errors="replace") for p in sources if p.stat().st_size > 4000]


def _slice(rng: random.Random, texts: list[str], n: int) -> str:
    text = rng.choice(texts)
    start = rng.randrange(0, max(1, len(text) - n))
    return text[start : start + n]


# A token's frequency rank is not its id: ranks spread over the vocabulary by a fixed shuffle (a real tokenizer's
# frequent tokens are not ids 0-127), so the ids' varints are as long as a real vocabulary's.
_RANKED_IDS = random.Random(7).sample(range(VOCAB), VOCAB)


def _zipf_ids(rng: random.Random, n: int) -> list[int]:
    # A Zipf(1.1)-like draw of frequency ranks (Pareto, cheap and deterministic), each mapped to its token id.
    return [_RANKED_IDS[min(VOCAB - 1, int(rng.paretovariate(1.1)) - 1 + rng.randrange(0, 4))] for _ in range(n)]


def draw_calls(shape: Shape, n: int, seed: int, texts: list[str]) -> list[ModelCallRecorded]:
    rng = random.Random(seed)
    calls: list[ModelCallRecorded] = []
    execution = parent = ""
    prefix = 0
    for i in range(n):
        if i % CALLS_PER_EXECUTION == 0:
            execution, parent, prefix = uuid.UUID(int=rng.getrandbits(128), version=4).hex, "", 0
        call = uuid.UUID(int=rng.getrandbits(128), version=4).hex
        user = _slice(rng, texts, max(1, shape.prompt_delta * 4 - 40))  # ~4 bytes a token of source text
        reply = _slice(rng, texts, shape.output * 4)
        context: dict[str, Any] = {
            "base": 2 * (i % CALLS_PER_EXECUTION) + 1,
            "messages": [{"role": "user" if shape.output == 6 else "tool", "content": user}],
            "response": {"role": "assistant", "content": reply},
        }
        e = ModelCallRecorded(
            execution_id=execution,
            call_id=call,
            parent_call_id=parent or None,
            prefix_len=prefix,
            prompt_delta_ids=_zipf_ids(rng, shape.prompt_delta),
            output_ids=_zipf_ids(rng, shape.output),
            output_logprobs=[-rng.expovariate(1.0) for _ in range(shape.output)],
            model="smollm2-135m-instruct",
            engine_id="http://127.0.0.1:18081",
            weight_version=f"step-{i // 512:06d}",
            finish_reason="stop",
            dialect="openai-chat",
            timings=CallTimings(
                queued_ms=rng.uniform(0.1, 30), ttft_ms=rng.uniform(5, 400), total_ms=rng.uniform(50, 4000)
            ),
            branch="extension" if parent else "root",
            temperature=1.0,
            context=context,
        )
        calls.append(e)
        parent, prefix = call, prefix + shape.tokens
    return calls


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def write(url: str, cfg: LogConfig, calls: list[ModelCallRecorded]) -> None:
    log = await EventLog.connect(url, cfg, configure=True)
    try:
        for i in range(0, len(calls), 512):
            split = [split_payload(e) for e in calls[i : i + 512]]
            await log.payloads.put_many([(e.execution_id, raw) for e, raw in split])
            await log.append_many([e for e, _ in split])
    finally:
        await log.close()


def _blocks(store: Path, stream: str) -> list[int]:
    files = sorted(store.rglob(f"streams/{stream}/msgs/*.blk"), key=lambda p: int(p.stem))
    return [p.stat().st_size for p in files]


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=24_000, help="calls per shape")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    texts = _texts()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "nats"
        nats = EmbeddedNats(store)
        url = nats.start()
        assert nats.proc is not None
        pid = nats.proc.pid
        cpu: dict[tuple[str, str], float] = {}
        try:
            for shape in SHAPES:
                calls = draw_calls(shape, args.calls, args.seed, texts)
                for comp in ("none", "s2"):
                    tag = f"{comp.upper()}{shape.tokens}"
                    cfg = LogConfig(stream=f"EV{tag}", prefix=f"ev{tag.lower()}.ev", compression=comp)
                    before = _cpu_s(pid)
                    await write(url, cfg, calls)
                    cpu[(shape.name, comp)] = _cpu_s(pid) - before
                    print(f"{shape.name} {comp}: written", file=sys.stderr)
        finally:
            nats.stop()
        for shape in SHAPES:
            files: dict[str, list[int]] = {}
            for comp in ("none", "s2"):
                cfg = LogConfig(stream=f"EV{comp.upper()}{shape.tokens}", compression=comp)
                # The last block of each stream is the active one, never compressed.
                files[comp] = _blocks(store, cfg.stream) + _blocks(store, cfg.payloads)
                sealed = _blocks(store, cfg.stream)[:-1] + _blocks(store, cfg.payloads)[:-1]
                files[f"{comp} sealed"] = sealed
            rows.append((shape, files, cpu[(shape.name, "none")], cpu[(shape.name, "s2")]))
    print(f"{args.calls} calls per shape, {CALLS_PER_EXECUTION} calls per execution, seed {args.seed}")
    print(
        "| calls of | tokens per call | none B/call | s2 B/call | s2 / none | sealed blocks s2 / none "
        "| none B/token | s2 B/token | block files | server CPU s none / s2 (ratio) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for shape, files, c_none, c_s2 in rows:
        none_b, s2_b = sum(files["none"]) / args.calls, sum(files["s2"]) / args.calls
        # Blocks are cut at the same uncompressed size, so the sealed ones hold the same messages in both.
        same = len(files["none sealed"]) == len(files["s2 sealed"]) > 0
        sealed_ratio = f"{sum(files['s2 sealed']) / sum(files['none sealed']):.3f}" if same else "—"
        print(
            f"| {shape.name} | {shape.tokens} | {none_b:,.0f} | {s2_b:,.0f} | {s2_b / none_b:.3f} | {sealed_ratio} "
            f"| {none_b / shape.tokens:.2f} | {s2_b / shape.tokens:.2f} | {len(files['none'])} "
            f"| {c_none:.2f} / {c_s2:.2f} ({c_s2 / max(c_none, 1e-9):.2f}) |"
        )


if __name__ == "__main__":
    asyncio.run(main())
