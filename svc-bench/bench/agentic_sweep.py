"""The saturation sweep on the built-in CPU engine (chat vs a coding-agent profile scaled to it), and replay vs
synthetic E2EL MAPE beside its noise floor.

    .venv/bin/python svc-bench/bench/agentic_sweep.py sweep --out bench-results/sweep   # both profiles
    .venv/bin/python svc-bench/bench/agentic_sweep.py mape --interleave sessions --concurrency 1 --repeats 6
    .venv/bin/python svc-bench/bench/agentic_sweep.py mape --interleave runs --concurrency 2 --repeats 6
    .venv/bin/python svc-bench/bench/agentic_sweep.py mape --interleave sessions --concurrency 1 --repeats 20 \
        --trace svc-bench/bench/data/loop-atif.json   # real rollouts of our loop (loop_atif.py), ATIF

The engine runs in its own process (tiny preset, one torch thread). Profiles are the paper's, scaled by the
explicit factors printed with every result (the engine is a CPU toy: lengths x0.05, the coding agent's 85
turns x0.1).

``mape``: a ShareGPT-format trace of real text (this repository's docs, paragraph by paragraph: a user paragraph
and the next one as the recorded reply, ``--turns`` exchanges per session) in three forms — replay (its messages
exactly), shadow (its lengths, random tokens) and synthetic (sessions drawn from the profile fitted to it, a fresh
draw each repeat) — against one engine, after one discarded warm-up replay (a fresh engine's first run is
slower). ``--interleave runs``: whole runs alternate R H S R H S ...; the MAPE is of pooled halves (even repeats
of one form against odd repeats of the other), and the noise floor the replay's even repeats against its odd
ones. ``--interleave sessions``: every form's sessions (the replay twice, R and R') shuffled into each run, so all
forms meet the machine at the same moments; the floor is R against R'. Headline: E2EL MAPE per turn index
(``opengyre.bench.e2el_mape``); beside it over quantiles, and the spread over single-run pairs. ``--trace`` (with
``--interleave sessions``) compares on a trace file instead, ATIF by default; the gaps between turns are dropped
from every form unless ``--tool-latency`` (they lengthen the runs and change no E2EL). With ``--interleave
sessions`` each figure has a 95 % bootstrap interval over sessions, every request is written to
``requests-sessions-*.csv``, and ``--uncapped`` adds the fit before capped replies and groups (issue 31) as a
fifth form in the same runs.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import multiprocessing
import os
import random
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from opengyre.bench import (
    LengthDist,
    LoadConfig,
    Profile,
    RequestResult,
    RunSpec,
    SessionPlan,
    TokenFill,
    check_comparable,
    e2el_mape,
    execute_run,
    fit_profile,
    mape_spread,
    paper_profile,
    plan_run,
    plot_per_turn_ttft,
    plot_sweep,
    read_trace,
    run_load,
    summarise,
    sweep,
    synthesise_sessions,
    write_json,
)
from opengyre.engine import EngineConfig, EngineProcess, EngineServer
from opengyre.models import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
MODEL = EngineConfig().model_name
# The tiny model's ids past its 256 bytes have no text (specials, skipped from content, and padding rows of the
# output layer) and it samples one now and then: a short reply of only those streams no content, which the load
# generator counts as failed. Forbidden for every form alike (a trace's short replies are where it bites).
TEXT_ONLY: dict[str, Any] = {"logit_bias": {str(t): -100 for t in range(256, 288)}}


async def _sweep(out: Path, cs: list[int], repeats: int, max_repeats: int, length: float) -> None:
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
                    f"{name} C={p.concurrency}: {p.mean:.2f} req/s  repeats {[round(x, 2) for x in p.throughputs]}"
                    f"  failed {len(p.failed)}",
                    flush=True,
                )

            res = await sweep(
                run_at, cs, repeats=repeats, max_repeats=max_repeats, tolerance=0.05, beyond=2, progress=progress
            )
            results[name] = {"profile": prof.to_dict(), "expected_isl": prof.expected_isl(), **res.to_dict()}
            plot_sweep(out / f"sweep-{name}.png", res, f"{name} (lengths x{length}, turns x{turns}) on the CPU engine")
            if res.curve:
                per_turn[name] = res.curve[-1].summaries[-1]
            print(
                f"{name}: C* = {res.c_star} (compatible {res.compatible}), collapse beyond C*: {res.collapse}",
                flush=True,
            )
    finally:
        await eng.stop()
    write_json(out / "sweep.json", results)
    plot_per_turn_ttft(out / "per-turn-ttft.png", per_turn)


def _serve_engine(cfg: EngineConfig, conn: Connection) -> None:
    async def main() -> None:
        async with EngineServer(cfg) as srv:
            conn.send(srv.url)
            await asyncio.to_thread(conn.recv)  # serve until told to stop

    asyncio.run(main())


@asynccontextmanager
async def _engine(prefix_cache: bool) -> AsyncIterator[str]:
    """The CPU engine in a child process (tiny preset, one torch thread), its prefix cache on or off."""
    cfg = EngineConfig(port=0, threads=1, prefix_cache_tokens=EngineConfig.prefix_cache_tokens if prefix_cache else 0)
    parent, child = multiprocessing.get_context("spawn").Pipe()
    proc = multiprocessing.get_context("spawn").Process(target=_serve_engine, args=(cfg, child), daemon=True)
    proc.start()
    try:
        yield await asyncio.to_thread(parent.recv)
    finally:
        parent.send(None)
        await asyncio.to_thread(proc.join, 30)
        if proc.is_alive():
            proc.kill()


async def _flush(url: str) -> None:
    """Empty the server's prefix cache (SGLang's route, which the CPU engine answers): every run starts cold, so a
    replay is not served from the cache an earlier replay of the same requests left behind."""
    async with httpx.AsyncClient() as c:
        (await c.post(f"{url}/flush_cache")).raise_for_status()


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
    forms = ("replay", "shadow", "synthetic")
    runs: dict[str, list[Any]] = {f: [] for f in forms}
    docs: dict[str, list[dict[str, Any]]] = {f: [] for f in forms}

    if a.repeats < 2:
        raise SystemExit("mape needs --repeats 2 or more (the floor compares repeats with each other)")
    async with _engine(prefix_cache=True) as url:

        def spec(form: str, seed: int) -> RunSpec:
            return RunSpec(
                url, MODEL, form=form, trace=trace_doc, trace_name="docs-trace", concurrency=concurrency, seed=seed
            )

        await execute_run(spec("replay", 0), tok)  # warm-up, discarded: a fresh engine's first run is slower
        for rep in range(a.repeats):
            for form in forms:
                await _flush(url)
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
    check_comparable(docs["replay"][0], docs["synthetic"][0])
    check_comparable(docs["replay"][0], docs["shadow"][0])
    result = {
        name: _compare(runs["replay"], runs[form] if form else None, a.min_per_turn)
        for name, form in _ROWS
        if form in (None, *forms)
    }
    _report(out, a, concurrency, trace_doc, runs, result, "runs")


def _trace(a: argparse.Namespace) -> tuple[Any, str, str]:
    """The trace ``mape`` compares on, its format and name: ``--trace`` (ATIF or ShareGPT), else the docs trace."""
    if a.trace is None:
        return _docs_trace(a.sessions, a.turns, a.prompt_chars, a.reply_chars), "sharegpt", "docs"
    return json.loads(a.trace.read_text()), a.trace_format, a.trace.stem


def _uncapped_fit(trace_doc: Any, fmt: str, tok: Any) -> Profile:
    """The profile as fitted before reply lengths cut at a cap were kept as recorded and groups of sessions
    starting alike were kept together: every reply length lognormal by moments (``LengthDist.fit``), every
    session its own first prompt, the rest as ``fit_profile`` fits it. The baseline of the ``--uncapped`` form,
    measured in the same runs as the current fit."""
    sessions = read_trace(trace_doc, fmt, tok)
    fitted = fit_profile("uncapped", sessions, "the fit before capped replies")
    by_turn: list[list[int]] = []
    for sess in sessions:
        for i, t in enumerate(sess.turns):
            while len(by_turn) <= i:
                by_turn.append([])
            by_turn[i].append(t.output_tokens)
    return replace(
        fitted,
        output=LengthDist.fit([x for v in by_turn for x in v]),
        output_by_turn=tuple(LengthDist.fit(v) for v in by_turn[: len(fitted.output_by_turn)]),
        group_size=1,
    )


def _without_delays(plans: list[SessionPlan]) -> list[SessionPlan]:
    """Every turn sent as soon as the previous reply is in: the replay's gaps (from ATIF timestamps) and the
    fitted profile's tool latency would stretch each run by seconds per session and change no E2EL."""
    return [replace(p, turns=tuple(replace(t, delay_s=0.0) for t in p.turns)) for p in plans]


async def _mape_mixed(out: Path, concurrency: int, a: argparse.Namespace) -> None:
    """Every form's sessions in one closed-loop run, in a shuffled order, the replay twice (R and R'): each form
    meets the machine at the same moments, so load that changes over seconds weighs on all alike. The floor is
    R against R' (the same requests, sent side by side); the comparison R against the other form, and R' too.
    The engine's prefix cache is off: R' would otherwise be served R's prompts from it (and R R''s)."""
    trace_doc, fmt, trace_name = _trace(a)
    tok = load_tokenizer()
    forms: tuple[str, ...] = ("replay", "replay2", "shadow", "synthetic")
    uncapped = _uncapped_fit(trace_doc, fmt, tok) if a.uncapped else None
    if uncapped is not None:
        forms += ("uncapped",)
    rows = [row for row in _ROWS if row[1] in (None, *forms)]
    runs: dict[str, list[list[RequestResult]]] = {f: [] for f in forms}

    def plans(rep: int) -> list[SessionPlan]:
        out: list[SessionPlan] = []
        for form in forms:
            if form == "uncapped" and uncapped is not None:
                planned = synthesise_sessions(uncapped, len(trace_doc), TokenFill.for_tokenizer(tok), seed=rep)
            else:
                spec = RunSpec(
                    "-",
                    MODEL,
                    form=form.rstrip("2"),
                    trace=trace_doc,
                    trace_format=fmt,
                    trace_name=trace_name,
                    seed=rep,
                )
                planned = plan_run(spec, tok)[0]
            if not a.tool_latency:
                planned = _without_delays(planned)
            out += [replace(p, session_id=f"{form}|{p.session_id}") for p in planned]
        random.Random(rep).shuffle(out)
        return out

    async with _engine(prefix_cache=False) as url:
        cfg = LoadConfig(url, MODEL, concurrency=concurrency, extra_body=TEXT_ONLY)
        await run_load(cfg, plans(0))  # warm-up, discarded: a fresh engine's first run is slower
        for rep in range(a.repeats):
            r = await run_load(cfg, plans(rep))
            if r.partial:
                raise SystemExit(f"repeat {rep}: partial run: {r.errors[:3]}")
            for form in forms:
                mine = [x for x in r.requests if x.session.startswith(form + "|")]
                runs[form].append([replace(x, session=x.session.split("|", 1)[1]) for x in mine])
            means = {f: sum(x.e2el or 0 for x in runs[f][-1]) / len(runs[f][-1]) * 1e3 for f in forms}
            print(
                f"repeat {rep}: {len(r.requests)} requests; mean E2EL "
                + ", ".join(f"{f} {m:.0f} ms" for f, m in means.items())
                + f"; load {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    # each repeat in units of its own mean E2EL over every form: a repeat the machine ran 5x slower weighs as
    # much as any other (forms share every repeat's moments, so the unit is the same for all of them)
    unit = [
        sum(x.e2el or 0.0 for f in forms for x in runs[f][i]) / sum(len(runs[f][i]) for f in forms)
        for i in range(a.repeats)
    ]
    scaled = {
        f: [[replace(x, e2el=(x.e2el or 0.0) / unit[i]) for x in rs] for i, rs in enumerate(runs[f])] for f in forms
    }
    result: dict[str, Any] = {}
    for name, other in rows:
        result[name] = _compare_mixed(
            scaled["replay"], scaled["replay2"], scaled[other] if other else None, a.min_per_turn
        )
        raw = _compare_mixed(runs["replay"], runs["replay2"], runs[other] if other else None, a.min_per_turn)
        result[name]["pooled_seconds"] = raw["pooled"]
        result[name]["bootstrap_95"] = _bootstrap(
            scaled["replay"], scaled["replay2"], scaled[other] if other else None, a.min_per_turn, a.bootstrap
        )
    _report(out, a, concurrency, trace_doc, runs, result, "sessions", trace_name)
    _write_requests(out / f"requests-sessions-c{concurrency}-{trace_name}.csv", runs, unit)


def _write_requests(path: Path, runs: dict[str, list[list[RequestResult]]], unit: list[float]) -> None:
    """Every request of every form and repeat: what a per-turn figure is made of (lengths, TTFT, E2EL), to
    look at where two forms part."""
    cols = ("form", "repeat", "session", "turn", "prompt_tokens", "output_tokens", "ttft_s", "e2el_s", "unit_s")
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for form, reps in runs.items():
            for i, rs in enumerate(reps):
                for r in rs:
                    w.writerow((form, i, r.session, r.turn, r.prompt_tokens, r.output_tokens, r.ttft, r.e2el, unit[i]))
    print(f"requests: {path}")


def _report(
    out: Path,
    a: argparse.Namespace,
    concurrency: int,
    trace_doc: list[dict[str, Any]],
    runs: dict[str, list[list[RequestResult]]],
    result: dict[str, Any],
    interleave: str,
    trace_name: str = "docs",
) -> None:
    doc: dict[str, Any] = {
        "trace": trace_name,
        "interleave": interleave,
        "trace_sessions": len(trace_doc),
        "requests_per_replay": len(runs["replay"][0]),
        "requests_per_synthetic": [len(x) for x in runs["synthetic"]],
        "concurrency": concurrency,
        "repeats": a.repeats,
        "min_per_turn": a.min_per_turn,
        "mape": result,
        "load_after": os.getloadavg(),
    }
    # what the server saw, per form and turn index (usage): where the forms' snowballs part, E2EL parts
    isl = {f: _per_turn_mean(rs, "prompt_tokens") for f, rs in runs.items()}
    doc["isl_per_turn"] = isl
    doc["e2el_ms_per_turn"] = {f: {k: v * 1e3 for k, v in _per_turn_mean(rs, "e2el").items()} for f, rs in runs.items()}
    suffix = "" if trace_name == "docs" else f"-{trace_name}"
    write_json(out / f"mape-{interleave}-c{concurrency}{suffix}.json", doc)
    how = {
        "runs": "runs interleaved R H S R H S ...; MAPE of pooled halves (even repeats vs odd)",
        "sessions": "sessions of every form shuffled into each run; MAPE of the pooled repeats, each repeat in units "
        "of its mean E2EL (in seconds: the second figure)",
    }[interleave]
    print(
        f"trace {trace_name}: {len(trace_doc)} sessions, {doc['requests_per_replay']} requests; C={concurrency}; "
        f"{a.repeats} repeats; {how}; beside it the mean (min-max) over single-run pairs"
    )
    for name, m in result.items():
        h, pt, q = m["pooled"], m["runs"]["per_turn"], m["runs"]["quantile"]
        sec = f" / {m['pooled_seconds']['per_turn_mape']:.1%}" if "pooled_seconds" in m else ""
        if "bootstrap_95" in m:
            sec += " [95 % over sessions {:.1%}-{:.1%}]".format(*m["bootstrap_95"])
        print(
            f"{name:>31}: E2EL MAPE per turn index {h['per_turn_mape']:.1%}{sec} (single runs {pt['mean']:.1%}, "
            f"{pt['min']:.1%}-{pt['max']:.1%}); over quantiles {h['quantile_mape']:.1%} (single runs {q['mean']:.1%})"
        )
        print(f"{'':>31}  per turn: " + " ".join(f"{k}: {v:.1%}" for k, v in m["per_turn_error"].items()))
    for f in runs:
        print(
            f"{f:>10} per turn: ISL "
            + " ".join(f"{v:.0f}" for v in isl[f].values())
            + "; E2EL ms "
            + " ".join(f"{v:.0f}" for v in doc["e2el_ms_per_turn"][f].values())
        )
    print(f"load average after: {os.getloadavg()}")


def _per_turn_mean(runs: list[list[RequestResult]], field: str) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for rs in runs:
        for r in rs:
            value = getattr(r, field)
            if r.ok and value is not None:
                by.setdefault(r.turn, []).append(float(value))
    return {k: sum(v) / len(v) for k, v in sorted(by.items())}


def _compare_mixed(
    r1: list[list[RequestResult]], r2: list[list[RequestResult]], other: list[list[RequestResult]] | None, mpt: int
) -> dict[str, Any]:
    """Pooled over the repeats: R against R' (the floor), or R and R' each against the other form (averaged)."""
    if other is None:
        pooled = [e2el_mape(_pool(r1), _pool(r2), mpt)]
        singles = [e2el_mape(x, y, mpt) for x, y in zip(r1, r2, strict=True)]
    else:
        pooled = [e2el_mape(_pool(r), _pool(other), mpt) for r in (r1, r2)]
        singles = [e2el_mape(r[i], other[i], mpt) for r in (r1, r2) for i in range(len(other))]
    return _summary(pooled, singles)


def _turn_sums(reps: list[list[RequestResult]], turns: int) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Per repeat and session (sorted by id), per turn index: the sum of E2EL and the number of requests."""
    ids = sorted({r.session for rs in reps for r in rs})
    row = {sid: i for i, sid in enumerate(ids)}
    sums = np.zeros((len(reps), len(ids), turns))
    counts = np.zeros((len(reps), len(ids), turns))
    for i, rs in enumerate(reps):
        for r in rs:
            if r.ok and r.e2el is not None:
                sums[i, row[r.session], r.turn - 1] += r.e2el
                counts[i, row[r.session], r.turn - 1] += 1
    return ids, sums, counts


def _bootstrap(
    r1: list[list[RequestResult]],
    r2: list[list[RequestResult]],
    other: list[list[RequestResult]] | None,
    mpt: int,
    draws: int,
) -> list[float]:
    """A 95 % interval of the pooled per-turn MAPE over sessions: in every repeat, the replay's sessions (the same
    draw for R and R', which send the same ones) and the other form's are drawn again with replacement, and the
    MAPE computed as for the figure (R and R' each against the other form, averaged; the floor: R against R').
    What the figure would be with other sessions like these: how far 12 trace sessions (or a form's draw of
    them) can resolve it."""
    turns = max(r.turn for reps in (r1, r2, other or []) for rs in reps for r in rs)
    ids1, s1, n1 = _turn_sums(r1, turns)
    ids2, s2, n2 = _turn_sums(r2, turns)
    if ids1 != ids2:
        raise SystemExit("R and R' sent different sessions")
    so, no = _turn_sums(other, turns)[1:] if other is not None else (None, None)
    rng = np.random.default_rng(0)
    reps = s1.shape[0]
    out: list[float] = []

    def mape(sa: np.ndarray, na: np.ndarray, sb: np.ndarray, nb: np.ndarray) -> float:
        keep = (na >= mpt) & (nb >= mpt)
        return float(np.mean(np.abs((sb[keep] / nb[keep]) / (sa[keep] / na[keep]) - 1.0)))

    for _ in range(draws):
        pick = rng.integers(0, s1.shape[1], size=(reps, s1.shape[1]))
        rows = np.arange(reps)[:, None]
        a1, c1 = s1[rows, pick].sum(axis=(0, 1)), n1[rows, pick].sum(axis=(0, 1))
        a2, c2 = s2[rows, pick].sum(axis=(0, 1)), n2[rows, pick].sum(axis=(0, 1))
        if so is None or no is None:
            out.append(mape(a1, c1, a2, c2))
            continue
        po = rng.integers(0, so.shape[1], size=(reps, so.shape[1]))
        b, cb = so[rows, po].sum(axis=(0, 1)), no[rows, po].sum(axis=(0, 1))
        out.append((mape(a1, c1, b, cb) + mape(a2, c2, b, cb)) / 2)
    lo, hi = np.percentile(out, [2.5, 97.5])
    return [float(lo), float(hi)]


def _summary(pooled: list[dict[str, Any]], singles: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "pooled": {k: sum(h[k] for h in pooled) / len(pooled) for k in ("per_turn_mape", "quantile_mape")},
        # each turn index's |B/A - 1|: where the forms part
        "per_turn_error": {
            k: sum(h["per_turn_error"][k] for h in pooled) / len(pooled) for k in pooled[0]["per_turn_error"]
        },
        "runs": {
            "per_turn": mape_spread([m["per_turn_mape"] for m in singles]),
            "quantile": mape_spread([m["quantile_mape"] for m in singles]),
        },
    }


# (row, form compared with the replay; None: the replay with itself, the noise floor)
_ROWS: tuple[tuple[str, str | None], ...] = (
    ("replay vs replay (noise floor)", None),
    ("shadow vs replay", "shadow"),
    ("synthetic vs replay", "synthetic"),
    ("synthetic, uncapped fit, vs replay", "uncapped"),
)


def _pool(runs: list[list[RequestResult]]) -> list[RequestResult]:
    """Several runs as one sample; sessions renamed by repeat so no request seems to have a partner."""
    return [replace(r, session=f"{i}:{r.session}") for i, rs in enumerate(runs) for r in rs]


def _compare(replays: list[list[RequestResult]], other: list[list[RequestResult]] | None, mpt: int) -> dict[str, Any]:
    """The replay's even repeats pooled against the other form's odd ones and odd against even (for the floor,
    the replay's even against its odd): equal samples, equally far apart in time, so time-varying load on the
    machine weighs on the floor as on the comparison. Beside it, every single-run pair."""
    if other is None:
        halves = [e2el_mape(_pool(replays[0::2]), _pool(replays[1::2]), mpt)]
        pairs = [(x, y) for i, x in enumerate(replays) for y in replays[i + 1 :]]
    else:
        halves = [
            e2el_mape(_pool(replays[0::2]), _pool(other[1::2]), mpt),
            e2el_mape(_pool(replays[1::2]), _pool(other[0::2]), mpt),
        ]
        pairs = [(x, y) for x in replays for y in other]
    return _summary(halves, [e2el_mape(x, y, mpt) for x, y in pairs])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("sweep", "mape"))
    ap.add_argument("--out", type=Path, default=Path("bench-results"))
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-repeats", type=int, default=8, help="sweep: runs per point at most (a step's test)")
    ap.add_argument("--length-scale", type=float, default=0.05)
    ap.add_argument("--sessions", type=int, default=24, help="mape: trace sessions at most")
    ap.add_argument("--turns", type=int, default=4, help="mape: turns per session")
    ap.add_argument("--prompt-chars", type=int, default=300, help="mape: user paragraphs cut to this")
    ap.add_argument("--reply-chars", type=int, default=24, help="mape: recorded replies cut to this")
    ap.add_argument("--min-per-turn", type=int, default=3, help="mape: turn indexes with fewer requests left out")
    ap.add_argument(
        "--interleave",
        choices=("runs", "sessions"),
        default="runs",
        help="mape: alternate whole runs of each form, or shuffle every form's sessions into each run",
    )
    ap.add_argument(
        "--bootstrap", type=int, default=2000, help="mape --interleave sessions: draws of the interval over sessions"
    )
    ap.add_argument(
        "--uncapped",
        action="store_true",
        help="mape --interleave sessions: also a synthetic form of the fit before capped replies were kept as"
        " recorded (every reply length lognormal), in the same runs",
    )
    ap.add_argument("--trace", type=Path, help="mape: the trace to compare on (default: the docs trace)")
    ap.add_argument("--trace-format", choices=("atif", "sharegpt"), default="atif", help="mape: --trace's format")
    ap.add_argument(
        "--tool-latency",
        action="store_true",
        help="mape --interleave sessions: keep the gaps between turns (trace timestamps, the fitted tool latency)",
    )
    a = ap.parse_args()
    if a.what == "mape" and a.interleave != "sessions" and (a.trace is not None or a.tool_latency):
        raise SystemExit("--trace and --tool-latency are for mape --interleave sessions")
    if a.what == "mape" and a.trace is not None and not a.trace.is_file():
        raise SystemExit(f"--trace {a.trace}: no such file")
    if a.what == "sweep":
        cs = [int(c) for c in a.concurrency.split(",")]
        asyncio.run(_sweep(a.out, cs, a.repeats, a.max_repeats, a.length_scale))
    else:
        mape = _mape if a.interleave == "runs" else _mape_mixed
        asyncio.run(mape(a.out, int(a.concurrency.split(",")[0]), a))


if __name__ == "__main__":
    main()
