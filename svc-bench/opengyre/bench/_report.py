"""Outputs: JSON and CSV results, plots, the ``bench-run-completed`` event, replay/synthetic comparison."""

from __future__ import annotations

import csv
import json
import math
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from opengyre.events import BenchRunCompleted

from ._load import RequestResult
from ._roofline import PhaseRoofline
from ._sweep import SweepResult

__all__ = [
    "completed_event",
    "plot_per_turn_ttft",
    "plot_roofline",
    "plot_sweep",
    "read_requests_csv",
    "write_json",
    "write_requests_csv",
]

_CSV_FIELDS = (
    "session",
    "turn",
    "ok",
    "error",
    "queue_s",
    "ttft",
    "tpot",
    "e2el",
    "prompt_tokens",
    "output_tokens",
    "max_tokens",
    "chunks",
)


def write_json(path: Path, doc: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=2, default=str, allow_nan=False) + "\n")


def write_requests_csv(path: Path, requests: Sequence[RequestResult]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_CSV_FIELDS)
        for r in requests:
            w.writerow(["" if (v := getattr(r, k)) is None else v for k in _CSV_FIELDS])


def completed_event(
    run_id: str | None, profile: str, concurrency: int, engine: str, summary: dict[str, Any]
) -> BenchRunCompleted:
    """The run's summary as the event svc-bench owns; only measured figures go in (no zero for a missing one)."""
    metrics: dict[str, float] = {
        "request_throughput": summary["request_throughput"],
        "output_token_throughput": summary["output_token_throughput"],
        "requests_ok": float(summary["requests_ok"]),
        "requests_failed": float(summary["requests_failed"]),
        "partial": 1.0 if summary["partial"] else 0.0,
    }
    for name in ("ttft_s", "tpot_s", "itl_s", "e2el_s"):
        for k, v in summary[name].items():
            if k != "n":
                metrics[f"{name[:-2]}_{k}_s"] = float(v)
    return BenchRunCompleted(
        run_id=run_id or uuid.uuid4().hex, profile=profile, concurrency=concurrency, engine=engine, metrics=metrics
    )


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_sweep(path: Path, result: SweepResult, title: str) -> None:
    """Throughput (mean of the complete repeats, 95 % interval) and median latencies per C; failed repeats are
    left out of every figure, marked where they happened and counted in the title."""
    plt = _plt()
    curve = result.curve
    cs = [p.concurrency for p in curve]
    means = [p.mean for p in curve]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    # the interval is geometric (from log throughputs), so it is asymmetric and never reaches below zero
    lo = [m - iv[0] if (iv := p.interval) else 0.0 for p, m in zip(curve, means, strict=True)]
    hi = [iv[1] - m if (iv := p.interval) else 0.0 for p, m in zip(curve, means, strict=True)]
    if curve:
        ax1.errorbar(cs, means, yerr=[lo, hi], marker="o", capsize=3, label="complete repeats")
    failed = [p for p in result.points if p.failed]
    if failed:
        ax1.scatter(
            [p.concurrency for p in failed],
            [0.0] * len(failed),
            marker="x",
            color="red",
            zorder=3,
            label="failed repeats (excluded)",
        )
        for p in failed:
            ax1.annotate(f"{len(p.failed)} failed", (p.concurrency, 0.0), textcoords="offset points", xytext=(4, 6))
    ax1.set_ylim(bottom=0.0)
    ax1.set_xscale("log", base=2)
    ax1.set_xlabel("concurrency C")
    ax1.set_ylabel("request throughput (req/s)")
    rng = result.c_star_range
    for ax in (ax1, ax2):
        if rng is not None and rng[0] != rng[1]:
            ax.axvspan(rng[0], rng[1], color="red", alpha=0.1, label=f"C compatible: {rng[0]}..{rng[1]}")
        if result.c_star is not None:
            ax.axvline(result.c_star, color="red", ls="--", label=f"C* = {result.c_star}")
    ttft = [float(np.mean([s["ttft_s"].get("p50", math.nan) for s in p.summaries])) for p in curve]
    e2el = [float(np.mean([s["e2el_s"].get("p50", math.nan) for s in p.summaries])) for p in curve]
    if curve:
        ax2.plot(cs, ttft, marker="o", label="TTFT p50")
        ax2.plot(cs, e2el, marker="s", label="E2EL p50")
        ax2.set_yscale("log")
    else:
        ax2.text(0.5, 0.5, "no complete repeat", ha="center", va="center", transform=ax2.transAxes)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("concurrency C")
    ax2.set_ylabel("seconds")
    for ax in (ax1, ax2):
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=8)
    n_failed = sum(len(p.failed) for p in result.points)
    fig.suptitle(title + (f" — PARTIAL: {n_failed} failed repeat(s) excluded" if n_failed else ""))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_per_turn_ttft(path: Path, summaries: dict[str, dict[str, Any]]) -> None:
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for label, s in summaries.items():
        turns = sorted(s["per_turn"], key=int)
        ax.plot([int(t) for t in turns], [s["per_turn"][t]["ttft_p50_s"] for t in turns], marker="o", label=label)
    ax.set_xlabel("turn index")
    ax.set_ylabel("TTFT p50 (s)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_roofline(path: Path, phases: Sequence[PhaseRoofline], title: str) -> None:
    """Component points (OI, attainable FLOP/s) per phase on the hardware's roofline."""
    plt = _plt()
    hw = phases[0].hardware
    fig, ax = plt.subplots(figsize=(7, 5))
    xs = np.logspace(-1, 5, 200)
    ax.plot(xs, np.minimum(hw.peak_flops, xs * hw.hbm_bandwidth), color="black", lw=1)
    ax.axvline(hw.ridge, color="grey", ls=":", label=f"ridge {hw.ridge:.0f} FLOP/B")
    markers = {"prefill": "o", "decode": "s"}
    for ph in phases:
        for name, c in ph.components.items():
            perf = min(hw.peak_flops, c.oi * hw.hbm_bandwidth)
            ax.scatter([c.oi], [perf], marker=markers.get(ph.phase, "x"), label=f"{ph.phase} {name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("operational intensity (FLOP/byte)")
    ax.set_ylabel("attainable FLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def read_requests_csv(path: Path) -> list[RequestResult]:
    """The per-request rows ``write_requests_csv`` wrote (enough for comparisons: times and counts)."""
    out: list[RequestResult] = []
    with path.open(newline="") as f:
        for row in csv.DictReader(f):
            ttft, e2el = (float(row[k]) if row[k] else None for k in ("ttft", "e2el"))
            out.append(
                RequestResult(
                    row["session"],
                    int(row["turn"]),
                    0.0,
                    0.0,
                    ttft=ttft,
                    e2el=e2el,
                    max_tokens=int(row["max_tokens"]),
                    ok=row["ok"] == "True",
                    error=row["error"],
                )
            )
    return out
