"""The saturation sweep on the built-in CPU engine (chat vs a coding-agent profile scaled to it), and replay vs
synthetic E2EL MAPE.

    .venv/bin/python svc-bench/bench/agentic_sweep.py sweep --out bench-results/sweep   # both profiles
    .venv/bin/python svc-bench/bench/agentic_sweep.py mape --out bench-results/mape

The engine runs in its own process (tiny preset, one torch thread). Profiles are the paper's, scaled by the
explicit factors printed with every result (the engine is a CPU toy: lengths x0.05, the coding agent's 85
turns x0.1). ``mape``: a ShareGPT-format trace of real text (this repository's docs, paragraph by paragraph:
user paragraphs and the next paragraph as the recorded reply, so replies have real recorded lengths) is
replayed exactly (after one discarded warm-up replay), then sent again as (a) the same lengths with random-token content ("shadow") and (b)
sessions synthesised from the profile fitted to the trace; each against the replay, E2EL MAPE over quantiles
and per-turn means. Repeating the replay itself gives the run-to-run noise floor.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from opengyre.bench import (
    LoadConfig,
    TokenFill,
    e2el_mape,
    fit_profile,
    paper_profile,
    plot_per_turn_ttft,
    plot_sweep,
    read_trace,
    replay_sessions,
    run_load,
    shadow_sessions,
    summarise,
    sweep,
    synthesise_sessions,
    write_json,
)
from opengyre.models import load_tokenizer
from opengyre.proxy.engine import EngineConfig, EngineProcess

ROOT = Path(__file__).resolve().parents[2]


async def _sweep(out: Path, cs: list[int], repeats: int, length: float) -> None:
    eng = await EngineProcess(EngineConfig(port=0, threads=1)).start()
    tok = load_tokenizer()
    fill = TokenFill.for_tokenizer(tok)
    model = eng.config.model_name
    results: dict[str, Any] = {}
    per_turn: dict[str, Any] = {}
    try:
        for name, turns in (("chat", 1.0), ("coding", 0.1)):
            prof = paper_profile(name).scaled(length, turns)

            async def run_at(c: int, rep: int, prof: Any = prof) -> tuple[Any, dict[str, Any]]:
                plans = synthesise_sessions(prof, max(2 * c, 4), fill, seed=1000 * rep + c)
                r = await run_load(LoadConfig(eng.url, model, concurrency=c, seed=rep), plans)
                return r, summarise(r)

            def progress(p: Any, name: str = name) -> None:
                print(
                    f"{name} C={p.concurrency}: {p.mean:.2f} req/s  repeats {[round(x, 2) for x in p.throughputs]}",
                    flush=True,
                )

            res = await sweep(run_at, cs, repeats=repeats, tolerance=0.05, beyond=2, progress=progress)
            results[name] = {"profile": prof.to_dict(), "expected_isl": prof.expected_isl(), **res.to_dict()}
            plot_sweep(out / f"sweep-{name}.png", res, f"{name} (lengths x{length}, turns x{turns}) on the CPU engine")
            per_turn[name] = res.points[-1].summaries[-1]
            print(f"{name}: C* = {res.c_star} (95% CI {res.c_star_ci}), collapse beyond C*: {res.collapse}", flush=True)
    finally:
        await eng.stop()
    write_json(out / "sweep.json", results)
    plot_per_turn_ttft(out / "per-turn-ttft.png", per_turn)


def _docs_trace(max_sessions: int, turns: int, prompt_chars: int, reply_chars: int) -> list[dict[str, Any]]:
    convs = []
    for path in sorted((ROOT / "docs").glob("*.md"))[:max_sessions]:
        paras = [p.strip() for p in path.read_text().split("\n\n") if 40 <= len(p.strip()) <= 600]
        msgs = []
        for i, p in enumerate(paras[: 2 * turns]):
            msgs.append(
                {"from": "human" if i % 2 == 0 else "gpt", "value": p[:reply_chars] if i % 2 else p[:prompt_chars]}
            )
        if len(msgs) >= 4:
            convs.append({"id": path.stem, "conversations": msgs[: len(msgs) // 2 * 2]})
    return convs


async def _mape(out: Path, concurrency: int, a: argparse.Namespace) -> None:
    eng = await EngineProcess(EngineConfig(port=0, threads=1)).start()
    tok = load_tokenizer()
    fill = TokenFill.for_tokenizer(tok)
    model = eng.config.model_name
    trace = read_trace(_docs_trace(a.sessions, a.turns, a.prompt_chars, a.reply_chars), "sharegpt", tok)
    prof = fit_profile("docs-trace", trace, "this repository's docs as a ShareGPT trace")
    cfg = LoadConfig(eng.url, model, concurrency=concurrency)
    n = len(trace)
    try:
        await run_load(cfg, replay_sessions(trace))  # warm-up, discarded: a fresh engine's first run is slower
        runs = {
            "replay": await run_load(cfg, replay_sessions(trace)),
            "replay-again": await run_load(cfg, replay_sessions(trace)),
            "shadow": await run_load(cfg, shadow_sessions(trace, fill)),
            "synthetic": await run_load(cfg, synthesise_sessions(prof, n, fill, seed=7)),
        }
    finally:
        await eng.stop()
    for k, r in runs.items():
        assert not r.partial, (k, r.errors)
    doc: dict[str, Any] = {
        "sessions": n,
        "requests": len(runs["replay"].requests),
        "concurrency": concurrency,
        "fitted_profile": prof.to_dict(),
        **{
            f"{k}_vs_replay": e2el_mape(runs["replay"].requests, runs[k].requests)
            for k in ("replay-again", "shadow", "synthetic")
        },
    }
    write_json(out / "mape.json", doc)
    for k in ("replay-again", "shadow", "synthetic"):
        m = doc[f"{k}_vs_replay"]
        print(
            f"{k:>13} vs replay: E2EL MAPE quantiles {m['quantile_mape']:.1%}, per-turn means {m['per_turn_mape']:.1%}"
        )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("sweep", "mape"))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--length-scale", type=float, default=0.05)
    ap.add_argument("--sessions", type=int, default=8, help="mape: trace sessions (one per docs file)")
    ap.add_argument("--turns", type=int, default=6, help="mape: turns per session at most")
    ap.add_argument("--prompt-chars", type=int, default=600, help="mape: user paragraphs cut to this")
    ap.add_argument("--reply-chars", type=int, default=120, help="mape: recorded replies cut to this")
    a = ap.parse_args()
    if a.what == "sweep":
        asyncio.run(_sweep(a.out, [int(c) for c in a.concurrency.split(",")], a.repeats, a.length_scale))
    else:
        asyncio.run(_mape(a.out, int(a.concurrency.split(",")[0]), a))


if __name__ == "__main__":
    main()
