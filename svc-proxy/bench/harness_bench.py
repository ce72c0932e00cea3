"""Per real harness: calls per episode, prompt tokens per call, the proxy's added latency per call, and the
trajectory tree's size against the flat form (issue 26's measures).

    .venv/bin/python svc-proxy/bench/harness_bench.py [--rounds 5]

Each harness's episodes are the requests it really sent on one scripted task (tests/proxy/fixtures/
harness_requests: Claude Code 2.1.328, Codex 0.169.0, OpenCode 1.18.33, mini-swe-agent 2.4.6, the Agents SDK
0.24.0; an episode is one capture run: ``shell-*``, ``subagent-*``, ``compact-*``, ...), replayed in order through
the real gateway (recording to a real JetStream log) to an SGLang-protocol engine whose replies are scripted (the
suite's). Replaying the captures instead of running the CLIs keeps the harness's own time out of the figure and
needs no CLI installed.

- added latency: the client's time for the call minus the gateway's engine dispatch (``timings.total_ms``, from
  sending ``/generate`` to its last byte), so what the gateway itself spends: parsing, rendering the template,
  tokenizing, matching the prefix, recording; ``×`` is the client's time over the engine's, in the same run.
- tree vs flat: token ids stored as the tree stores them (each call's prompt delta and output) against every
  call's whole prompt and output (int32 ids, before the payload store's own encoding).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the suite's scripted SGLang engine

from opengyre.asgi import HttpServer  # noqa: E402
from opengyre.eventlog import EventLog, LogConfig  # noqa: E402
from opengyre.events import ModelCallRecorded  # noqa: E402
from opengyre.proxy.gateway import Gateway, GatewayConfig  # noqa: E402
from opengyre.runtime import EmbeddedNats  # noqa: E402
from opengyre.trajectory import resolve_calls  # noqa: E402
from tests.proxy._scripted_sglang import scripted_sglang  # noqa: E402

FIXTURES = ROOT / "tests" / "proxy" / "fixtures" / "harness_requests"
MODELS = ("qwen3-8b", "gpt-5.5-codex")
HOSTED = ("web_search", "tool_search")  # Codex's default config offers them: refused (docs/proxy.md), not timed


async def _send(gw: Gateway, rec: dict[str, Any], eid: str, client: httpx.AsyncClient) -> tuple[int, float]:
    key = gw.issue_key(eid)
    headers = {k: v for k, v in rec["headers"].items() if k.lower() not in ("x-api-key", "authorization", "host")}
    headers.pop("content-length", None)
    headers.pop("Content-Length", None)
    anthropic = any(k.lower() == "anthropic-version" for k in headers)
    headers["x-api-key" if anthropic else "authorization"] = key if anthropic else f"Bearer {key}"
    path = rec["path"].removeprefix("/v1").split("?")[0]
    t0 = time.perf_counter()
    r = await client.post(f"{gw.base_url(eid)}{path}", json=rec["body"], headers=headers)
    await r.aread()
    return r.status_code, (time.perf_counter() - t0) * 1000


async def _events(log: EventLog, gw: Gateway) -> dict[str, ModelCallRecorded]:
    await gw.recorder.flush()
    stored = []
    async for s in log.read():
        if s.type_name == "model-call-recorded":
            e = log.decode(s)
            assert isinstance(e, ModelCallRecorded)
            stored.append(e)
    return {e.call_id: e for e in await resolve_calls(log, stored)}


def _episodes() -> dict[str, dict[str, list[Path]]]:
    out: dict[str, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for p in sorted(FIXTURES.glob("*/*.json")):
        out[p.parent.name][p.stem.rsplit("-", 1)[0]].append(p)
    return out


async def main(rounds: int) -> None:
    app, _prompts = scripted_sglang(lambda _p: "fine", context_length=1 << 18)
    engine = HttpServer(app)
    await engine.start()
    with tempfile.TemporaryDirectory() as tmp:
        nats = EmbeddedNats(Path(tmp) / "nats")
        nats.start()
        log = await EventLog.connect(nats.url, LogConfig())
        gw = Gateway(GatewayConfig(models=MODELS), event_log=log)
        await gw.start()
        await gw.pool.add("scripted", engine.url)
        client_ms: dict[str, float] = {}
        rows: list[tuple[str, str, str]] = []  # harness, episode, execution
        try:
            async with httpx.AsyncClient(timeout=120) as client:
                for harness, episodes in _episodes().items():
                    for episode, files in episodes.items():
                        for r in range(rounds):
                            eid = f"b-{harness}-{episode}-{r}"
                            before = set((await _events(log, gw)).keys())
                            for p in files:
                                rec = json.loads(p.read_text())
                                if any(t.get("type") in HOSTED for t in rec["body"].get("tools", [])):
                                    continue
                                status, ms = await _send(gw, rec, eid, client)
                                if status != 200:
                                    raise SystemExit(f"{p}: {status}")
                                new = set((await _events(log, gw)).keys()) - before
                                [call_id] = new
                                before |= new
                                client_ms[call_id] = ms
                            rows.append((harness, episode, eid))
            events = await _events(log, gw)
        finally:
            await gw.stop()
            await log.close()
            nats.stop()
            await engine.stop()
    _report(rows, events, client_ms, rounds)


def _report(
    rows: list[tuple[str, str, str]], events: dict[str, ModelCallRecorded], client_ms: dict[str, float], rounds: int
) -> None:
    print(f"{rounds} round(s) per episode; figures: median over calls (all rounds)")
    head = (
        f"{'harness':<15} {'episode':<15} {'calls':>5} {'prompt tok/call':>15} {'added ms':>9} "
        f"{'client/engine':>13} {'tree/flat':>9}"
    )
    print(head)
    by: dict[tuple[str, str], list[ModelCallRecorded]] = defaultdict(list)
    for harness, episode, eid in rows:
        by[(harness, episode)] += [e for e in events.values() if e.execution_id == eid]
    for (harness, episode), calls in by.items():
        if not calls:
            print(f"{harness:<15} {episode:<15} every call refused: it offers hosted tools (docs/proxy.md)")
            continue
        prompt = [e.prefix_len + len(e.prompt_delta_ids) for e in calls]
        added = [client_ms[e.call_id] - e.timings.total_ms for e in calls]
        ratio = [client_ms[e.call_id] / e.timings.total_ms for e in calls if e.timings.total_ms > 0]
        tree = sum(len(e.prompt_delta_ids) + len(e.output_ids) for e in calls)
        flat = sum(p + len(e.output_ids) for p, e in zip(prompt, calls, strict=True))
        print(
            f"{harness:<15} {episode:<15} {len(calls) // rounds:>5} {statistics.median(prompt):>15,.0f} "
            f"{statistics.median(added):>9.1f} {statistics.median(ratio):>12.2f}x {tree / flat:>9.3f}"
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(ap.parse_args().rounds))
