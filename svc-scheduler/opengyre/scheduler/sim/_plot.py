"""GPU utilisation over time, one panel per policy (PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._result import SimResult

__all__ = ["plot_utilisation"]

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
