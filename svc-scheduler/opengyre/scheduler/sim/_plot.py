"""Plots (PNG): GPU utilisation over time, one panel per policy; the ratios' sensitivity to two knobs."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._result import SimResult

__all__ = ["plot_sensitivity", "plot_utilisation"]

_LAYERS = (
    ("rollout_busy", "rollout (slot held)", "#2b7bba"),
    ("training_busy", "training (micro-step)", "#e4572e"),
    ("rollout_idle", "rollout idle", "#a6cee3"),
    ("training_idle", "training idle", "#fdbf6f"),
    ("other", "switching / idle", "#bbbbbb"),
)


def plot_utilisation(results: Sequence[SimResult], path: Path, *, title: str = "") -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(results), 1, figsize=(10, 2.1 * len(results) + 0.8), sharex=True, squeeze=False)
    longest = max((r.hours for r in results), default=1.0)
    for ax, r in zip(axes[:, 0], results, strict=True):
        t = r.timeline["t_h"]
        ax.stackplot(t, *[r.timeline[k] for k, _, _ in _LAYERS], colors=[c for _, _, c in _LAYERS],
                     labels=[lbl for _, lbl, _ in _LAYERS], linewidth=0)  # fmt: skip
        ax.set_xlim(0, longest)
        ax.set_ylim(0, 1)
        ax.set_ylabel("GPU share")
        ax.set_title(
            f"{r.policy}: {r.hours:.1f} h, busy {r.utilisation:.0%}, staleness {r.staleness_mean:.2f} "
            f"(max {r.staleness_max}), ideal {r.bound.hours:.1f} h",
            fontsize=9,
            loc="left",
        )
    axes[0, 0].legend(loc="upper center", bbox_to_anchor=(0.5, 1.6), ncol=5, fontsize=8, frameon=False)
    axes[-1, 0].set_xlabel("hours")
    if title:
        fig.suptitle(title, fontsize=10, y=0.995)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_sensitivity(
    grid: Mapping[tuple[int, float], Mapping[str, float]],
    path: Path,
    *,
    panels: Sequence[tuple[str, str]],
    marks: Mapping[str, tuple[float, float]] = {},
    title: str = "",
) -> Path:
    """Heatmaps over (slots per cell, micro-step seconds): one panel per ``(key, label)`` of the grid's values,
    each cell annotated, with ``marks`` (label -> (slots, micro-step)) drawn on every panel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    slots = sorted({float(k[0]) for k in grid})
    micro = sorted({float(k[1]) for k in grid})

    def edges(xs: list[float]) -> Any:
        logs = np.log(np.asarray(xs, dtype=float))
        mid = (logs[1:] + logs[:-1]) / 2
        first, last = logs[0] - (mid[0] - logs[0]), logs[-1] + (logs[-1] - mid[-1])
        return np.exp(np.concatenate([[first], mid, [last]]))

    fig, axes = plt.subplots(1, len(panels), figsize=(5.6 * len(panels), 4.6), squeeze=False)
    for ax, (key, label) in zip(axes[0], panels, strict=True):
        z = np.array([[grid[(int(s), m)][key] for s in slots] for m in micro])
        mesh = ax.pcolormesh(edges(slots), edges(micro), z, cmap="viridis", shading="flat")
        for i, m in enumerate(micro):
            for j, s in enumerate(slots):
                ax.text(s, m, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=7, color="white")
        for name, (s, m) in marks.items():
            ax.plot([s], [m], marker="o", markersize=9, markerfacecolor="none", markeredgecolor="red", mew=2)
            ax.annotate(name, (s, m), textcoords="offset points", xytext=(6, 6), color="red", fontsize=8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xticks(slots, [f"{s:g}" for s in slots])
        ax.set_yticks(micro, [f"{m:g}" for m in micro])
        ax.minorticks_off()
        ax.set_xlabel("executions per cell (slots)")
        ax.set_ylabel("micro-step of one group on one cell (s)")
        ax.set_title(label, fontsize=9)
        fig.colorbar(mesh, ax=ax)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
