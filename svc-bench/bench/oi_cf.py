"""Operational intensity against capacity footprint per profile and model, as AgentPerfBench plots them.

    .venv/bin/python svc-bench/bench/oi_cf.py --out docs/bench-oi-cf.png

Analytic (``opengyre.bench``'s roofline, no measurement): for each of the paper's profiles, at its mean ISL and
OSL, the OI of the projection GEMMs (QKV/O + MLP, over all layers) in the prefill of one prompt and in a decode
step of ``--batch`` requests, against the capacity footprint per GPU (weights + the KV of ``--concurrency``
requests each holding ISL + OSL tokens). The ridge and the HBM capacity split the plane into compute- or
memory-bound and fits or does not fit. Models: Llama-3.1-8B (TP 1) and Llama-3.1-70B (TP 4) on H100, their
shapes as their published config.json files state them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from opengyre.bench import PAPER_PROFILES, ModelShape, capacity, hardware, paper_profile, phase_roofline

LLAMA_31_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
}
LLAMA_31_70B = {
    **LLAMA_31_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_attention_heads": 64,
    "num_hidden_layers": 80,
}
MODELS = (("Llama-3.1-8B", LLAMA_31_8B, 1), ("Llama-3.1-70B", LLAMA_31_70B, 4))
GB = 1e9


@dataclass(frozen=True)
class Point:
    model: str
    tp: int
    profile: str
    isl: int
    osl: int
    prefill_oi: float
    decode_oi: float
    footprint_gb: float
    max_concurrency: int


def points(hw_name: str, batch: int, concurrency: int) -> list[Point]:
    hw = hardware(hw_name)
    rows: list[Point] = []
    for model, cfg, tp in MODELS:
        shape = ModelShape.from_config(cfg, name=model)
        for name in PAPER_PROFILES:
            p = paper_profile(name)
            isl, osl = round(p.expected_isl()), round(p.output.mean)
            pre = phase_roofline(shape, hw, "prefill", requests=1, new_tokens=isl, context=0)
            dec = phase_roofline(shape, hw, "decode", requests=batch, new_tokens=1, context=isl + osl // 2)
            cap = capacity(shape, hw, context=isl + osl, tp=tp)
            rows.append(
                Point(
                    model,
                    tp,
                    name,
                    isl,
                    osl,
                    (pre.components["qkv_o"] + pre.components["mlp"]).oi,
                    (dec.components["qkv_o"] + dec.components["mlp"]).oi,
                    cap.footprint(concurrency) / GB,
                    cap.max_concurrency,
                )
            )
    return rows


def plot(path: Path, rows: list[Point], hw_name: str, batch: int, concurrency: int) -> None:
    hw = hardware(hw_name)
    models = [m for m, _, _ in MODELS]
    fig, axes = plt.subplots(1, len(models), figsize=(12, 5), sharey=False)
    colours = dict(zip(PAPER_PROFILES, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for ax, model in zip(axes, models, strict=True):
        for r in (r for r in rows if r.model == model):
            c = colours[r.profile]
            x, y = [r.decode_oi, r.prefill_oi], [r.footprint_gb] * 2
            ax.plot(x, y, color=c, lw=1, alpha=0.6)
            ax.scatter(x[1:], y[1:], color=c, marker="o", label=f"{r.profile} prefill (ISL {r.isl})")
            ax.scatter(x[:1], y[:1], color=c, marker="s", facecolors="none", label=f"{r.profile} decode")
        ax.axvline(hw.ridge, color="grey", ls=":", label=f"ridge {hw.ridge:.0f} FLOP/B")
        ax.axhline(hw.hbm_capacity / GB, color="black", ls="--", lw=1, label=f"HBM {hw.hbm_capacity / GB:.0f} GB")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("operational intensity of the projections (FLOP/byte)")
        ax.set_ylabel(f"capacity footprint per GPU at C={concurrency} (GB)")
        tp = next(t for m, _, t in MODELS if m == model)
        ax.set_title(f"{model}, TP {tp}, {hw.name}")
        ax.grid(True, which="both", alpha=0.2)
    axes[-1].legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    fig.suptitle(f"OI x CF per profile: prefill of one prompt (o), decode step of {batch} requests (square)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    ap.add_argument("--hardware", default="H100")
    ap.add_argument("--batch", type=int, default=64, help="decode batch")
    ap.add_argument("--concurrency", type=int, default=40, help="requests resident for the footprint")
    a = ap.parse_args()
    if a.batch < 1 or a.concurrency < 1:
        raise SystemExit("--batch and --concurrency must be >= 1")
    rows = points(a.hardware, a.batch, a.concurrency)
    plot(a.out, rows, a.hardware, a.batch, a.concurrency)
    print(
        f"{'model':>14} {'profile':>13} {'ISL/OSL':>11} {'prefill OI':>10} {'decode OI':>9} {'CF GB':>7} {'max C':>6}"
    )
    for r in rows:
        print(
            f"{r.model:>14} {r.profile:>13} {f'{r.isl}/{r.osl}':>11} {r.prefill_oi:>10.0f} {r.decode_oi:>9.0f} "
            f"{r.footprint_gb:>7.1f} {r.max_concurrency:>6}"
        )
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
