"""The report's figures, drawn from a summary with matplotlib's object API (no pyplot: no global state, safe in
any thread), each returned as SVG text, or None with the reason when the log holds nothing to draw."""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from ._model import RunSummary

__all__ = ["PLOTS", "Plot", "render_plot"]

# Fixed per role, so the same role has the same colour in every report.
ROLE_COLOURS = {
    "idle": "#c7c7c7",
    "rollout": "#2ca02c",
    "draining": "#ffbf00",
    "switching": "#9467bd",
    "training-core": "#1f4e9c",
    "training-satellite": "#6baed6",
}

Plot = Callable[[RunSummary], Figure | str]  # a figure, or why there is none


def _reward(s: RunSummary) -> Figure | str:
    # (step, mean, min, max) of the steps that consumed a scored execution (all three are set together)
    scored = [
        (r.step, mean, lo, hi)
        for r in s.steps
        if (mean := r.mean) is not None and (lo := r.min) is not None and (hi := r.max) is not None
    ]
    if not scored and not s.rewards_by_batch:
        return "no scored execution was consumed by a training step, nor dispatched for one"
    fig = Figure(figsize=(7.5, 3.4), layout="constrained")
    ax = fig.add_subplot()
    if scored:
        steps = [r[0] for r in scored]
        ax.fill_between(steps, [r[2] for r in scored], [r[3] for r in scored], alpha=0.2, label="min–max")
        ax.plot(steps, [r[1] for r in scored], marker="o", label="mean, executions the step consumed")
    if s.rewards_by_batch:
        batches = sorted(s.rewards_by_batch)
        ax.plot(
            batches, [s.rewards_by_batch[b][1] for b in batches], linestyle="--", marker=".",
            label="mean, executions dispatched for the step",
        )  # fmt: skip
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("training step")
    ax.set_ylabel("reward")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _roles(s: RunSummary) -> Figure | str:
    if not s.cell_spans:
        return "no cell events in the log"
    cells = sorted({c.cell_id for c in s.cell_spans})
    end = s.time.span_s
    fig = Figure(figsize=(7.5, 0.9 + 0.45 * len(cells)), layout="constrained")
    ax = fig.add_subplot()
    # One bar collection per (cell, role): a long run has thousands of spans, and a collection each is slow.
    bars: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for span in s.cell_spans:
        stop = span.end_s if span.end_s is not None else end
        bars.setdefault((span.cell_id, span.role), []).append((span.start_s, max(stop - span.start_s, end * 1e-3)))
    row = {cid: i for i, cid in enumerate(cells)}
    for (cid, role), xs in bars.items():
        ax.broken_barh(xs, (row[cid] - 0.4, 0.8), facecolors=ROLE_COLOURS.get(role, "#000000"))
    ax.set_yticks(range(len(cells)), cells)
    ax.set_xlabel("seconds since the first event")
    seen = sorted({x.role for x in s.cell_spans}, key=list(ROLE_COLOURS).index)
    ax.legend(
        handles=[Patch(color=ROLE_COLOURS[r], label=r) for r in seen], fontsize="small", loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
    )  # fmt: skip
    return fig


def _watermark(s: RunSummary) -> Figure | str:
    if not s.watermark:
        return "no execution or cell events in the log"
    t = [p.at_s for p in s.watermark]
    fig = Figure(figsize=(7.5, 3.2), layout="constrained")
    ax = fig.add_subplot()
    ax.step(t, [p.watermark for p in s.watermark], where="post", label="w(t): dispatched − finished")
    if s.cells:
        ax.step(t, [p.rollout_capacity for p in s.watermark], where="post", label="CR(t): rollout capacity")
    ax.set_xlabel("seconds since the first event")
    ax.set_ylabel("executions")
    ax.legend(fontsize="small")
    ax.grid(alpha=0.3)
    return fig


def _difficulty(s: RunSummary) -> Figure | str:
    if not s.difficulty:
        return "no task events in the log"
    rounds = [d.round for d in s.difficulty]
    fig = Figure(figsize=(7.5, 3.4), layout="constrained")
    left, right = fig.subplots(1, 2)
    knobs = sorted({k for d in s.difficulty for k in d.knobs})
    for k in knobs:
        pts = [(d.round, d.knobs[k]) for d in s.difficulty if k in d.knobs]
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=k)
    if not knobs:
        left.plot(rounds, [d.patterns_mean for d in s.difficulty], marker="o", label="patterns per task")
    left.set_xlabel("round (task version)")
    left.set_title("knob means", fontsize="medium")
    left.legend(fontsize="x-small")
    scored = [d for d in s.difficulty if d.reward_mean is not None]
    right.bar([d.round for d in scored], [d.reward_mean or 0.0 for d in scored], color="#2ca02c")
    right.set_xlabel("round (task version)")
    right.set_title("mean reward", fontsize="medium")
    for ax in (left, right):
        ax.set_xticks(rounds)
        ax.grid(alpha=0.3)
    return fig


def _time(s: RunSummary) -> Figure | str:
    kinds = [
        ("synthesis", s.time.synthesis_s),
        ("rollout", s.time.rollout_s),
        ("training", s.time.training_s),
        ("switching", s.time.switching_s),
    ]
    known = [(k, v) for k, v in kinds if v is not None]
    if not known and not s.time.cell_seconds:
        return "no event in the log shows work with a duration"
    fig = Figure(figsize=(7.5, 3.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    left.barh([k for k, _ in known][::-1], [v for _, v in known][::-1], color="#1f77b4")
    left.axvline(s.time.span_s, color="k", linestyle=":", label=f"run span {s.time.span_s:.0f} s")
    left.set_xlabel("wall-clock seconds")
    left.legend(fontsize="x-small")
    roles = [r for r in ROLE_COLOURS if r in s.time.cell_seconds]
    right.barh(roles[::-1], [s.time.cell_seconds[r] for r in roles][::-1], color=[ROLE_COLOURS[r] for r in roles][::-1])
    right.set_xlabel("cell-seconds by role")
    return fig


# id -> (title, what it shows, the drawing)
PLOTS: dict[str, tuple[str, str, Plot]] = {
    "reward": (
        "Reward per step",
        "Solid: mean (band: min to max) score of the executions each training step consumed. Dashed: mean score "
        "of the executions dispatched for each step, known before the step trains.",
        _reward,
    ),
    "roles": ("Cell roles over time", "Each cell's role from its registration to the last event.", _roles),
    "watermark": (
        "Watermark",
        "w(t), executions dispatched and not yet finished, against CR(t), the capacity of the cells in rollout: a "
        "cell may leave rollout only while w(t) ≤ CR(t) − its capacity.",
        _watermark,
    ),
    "difficulty": (
        "Task difficulty per round",
        "Round r holds the task versions at version r (1 as synthesized, +1 per hardening): the mean of each "
        "pattern knob they set, and the mean score of the executions run on them.",
        _difficulty,
    ),
    "time": (
        "Where time went",
        "Wall-clock seconds during which each kind of work was under way (they overlap when the run streams), and "
        "the cells' time by role.",
        _time,
    ),
}


def render_plot(s: RunSummary, plot: Plot) -> tuple[str | None, str]:
    """(SVG text, "") or (None, why there is no figure)."""
    fig = plot(s)
    if isinstance(fig, str):
        return None, fig
    out = io.StringIO()
    # A fixed hash salt and text as text: the same summary gives the same bytes, and the file stays small.
    with matplotlib.rc_context({"svg.hashsalt": "opengyre", "svg.fonttype": "none"}):
        fig.savefig(out, format="svg", metadata={"Date": None})
    return out.getvalue(), ""
