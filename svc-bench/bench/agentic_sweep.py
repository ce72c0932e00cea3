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
import os
from pathlib import Path
from typing import Any

from opengyre.bench import (
    LoadConfig,
    RunSpec,
    TokenFill,
    check_comparable,
    e2el_mape,
    execute_run,
    mape_spread,
    paper_profile,
    plot_per_turn_ttft,
    plot_sweep,
    run_load,
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
    """This repository's docs as a ShareGPT trace: paragraphs in order, a user paragraph then the next one as the
    recorded reply, ``turns`` exchanges per session, files cut into as many sessions as they hold."""
    convs = []
    for path in sorted((ROOT / "docs").glob("*.md")):
        paras = [p.strip() for p in path.read_text().split("\n\n") if 40 <= len(p.strip()) <= 600]
        for start in range(0, len(paras) - 2 * turns + 1, 2 * turns):
            chunk = paras[start : start + 2 * turns]
            msgs = [
                {"from": "human" if i % 2 == 0 else "gpt", "value": p[:reply_chars] if i % 2 else p[:prompt_chars]}
                for i, p in enumerate(chunk)
            ]
            convs.append({"id": f"{path.stem}-{start}", "conversations": msgs})
    return convs[:max_sessions]


async def _mape(out: Path, concurrency: int, a: argparse.Namespace) -> None:
    """Replay, shadow and synthetic forms of one trace, interleaved (R H S R H S ...) against one engine, each
    form ``repeats`` times; every replay-vs-form pair gives a MAPE, and replay-vs-replay pairs the noise floor."""
    trace_doc = _docs_trace(a.sessions, a.turns, a.prompt_chars, a.reply_chars)
    tok = load_tokenizer()
    eng = await EngineProcess(EngineConfig(port=0, threads=1)).start()
    model = eng.config.model_name
    forms = ("replay", "shadow", "synthetic")
    runs: dict[str, list[Any]] = {f: [] for f in forms}
    docs: dict[str, list[dict[str, Any]]] = {f: [] for f in forms}

    def spec(form: str, seed: int) -> RunSpec:
        return RunSpec(
            eng.url, model, form=form, trace=trace_doc, trace_name="docs-trace", concurrency=concurrency, seed=seed
        )

    try:
        await execute_run(spec("replay", 0), tok)  # warm-up, discarded: a fresh engine's first run is slower
        for rep in range(a.repeats):
            for form in forms:
                # the synthetic form draws fresh sessions each repeat (seed): its MAPE includes the finite draw
                r, d = await execute_run(spec(form, rep), tok)
                if r.partial:
                    raise SystemExit(f"{form} repeat {rep}: partial run: {r.errors[:3]}")
                runs[form].append(r.requests)
                docs[form].append(d)
                print(
                    f"repeat {rep} {form:>9}: {len(r.requests)} requests, mean E2EL "
                    f"{d['summary']['e2el_s']['mean'] * 1e3:.0f} ms, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    finally:
        await eng.stop()
    check_comparable(docs["replay"][0], docs["synthetic"][0])
    pairs = {
        "replay vs replay (noise floor)": [
            (x, y) for i, x in enumerate(runs["replay"]) for y in runs["replay"][i + 1 :]
        ],
        "shadow vs replay": [(x, y) for x in runs["replay"] for y in runs["shadow"]],
        "synthetic vs replay": [(x, y) for x in runs["replay"] for y in runs["synthetic"]],
        "synthetic vs synthetic (draw to draw)": [
            (x, y) for i, x in enumerate(runs["synthetic"]) for y in runs["synthetic"][i + 1 :]
        ],
    }
    result: dict[str, Any] = {}
    for name, ps in pairs.items():
        ms = [e2el_mape(x, y, a.min_per_turn) for x, y in ps]
        result[name] = {
            "per_turn": mape_spread([m["per_turn_mape"] for m in ms]),
            "quantile": mape_spread([m["quantile_mape"] for m in ms]),
            "paired": mape_spread([m["paired_mape"] for m in ms]) if ms[0]["paired_mape"] is not None else None,
            "turns_compared": sorted({t for m in ms for t in m["turns_compared"]}),
        }
    doc: dict[str, Any] = {
        "trace_sessions": len(trace_doc),
        "requests_per_replay": len(runs["replay"][0]),
        "requests_per_synthetic": [len(x) for x in runs["synthetic"]],
        "concurrency": concurrency,
        "repeats": a.repeats,
        "min_per_turn": a.min_per_turn,
        "fitted_profile": docs["synthetic"][0]["profile"],
        "mape": result,
        "load_after": os.getloadavg(),
    }
    write_json(out / "mape.json", doc)
    print(
        f"trace: {len(trace_doc)} sessions, {doc['requests_per_replay']} requests; C={concurrency}; "
        f"{a.repeats} repeats of each form, interleaved"
    )
    for name, m in result.items():
        pt, q = m["per_turn"], m["quantile"]
        print(
            f"{name:>38}: E2EL MAPE per turn index {pt['mean']:.1%} ({pt['min']:.1%}-{pt['max']:.1%}, {pt['n']} pairs)"
            f", over quantiles {q['mean']:.1%} ({q['min']:.1%}-{q['max']:.1%})"
            + (f", per request {m['paired']['mean']:.1%}" if m["paired"] else "")
        )
    print(f"load average after: {os.getloadavg()}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("sweep", "mape"))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--length-scale", type=float, default=0.05)
    ap.add_argument("--sessions", type=int, default=24, help="mape: trace sessions at most")
    ap.add_argument("--turns", type=int, default=4, help="mape: turns per session")
    ap.add_argument("--prompt-chars", type=int, default=300, help="mape: user paragraphs cut to this")
    ap.add_argument("--reply-chars", type=int, default=24, help="mape: recorded replies cut to this")
    ap.add_argument("--min-per-turn", type=int, default=3, help="mape: turn indexes with fewer requests left out")
    a = ap.parse_args()
    if a.what == "sweep":
        asyncio.run(_sweep(a.out, [int(c) for c in a.concurrency.split(",")], a.repeats, a.length_scale))
    else:
        asyncio.run(_mape(a.out, int(a.concurrency.split(",")[0]), a))


if __name__ == "__main__":
    main()
