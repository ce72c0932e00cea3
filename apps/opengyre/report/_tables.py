"""Rich renderings of a summary: the end-of-run tables and the live dashboard's panels (one code for both)."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from ._model import RunSummary

__all__ = ["ROLE_STYLE", "dashboard_view", "summary_table"]

ROLE_STYLE = {
    "idle": "dim",
    "rollout": "green",
    "draining": "yellow",
    "switching": "magenta",
    "training-core": "bold blue",
    "training-satellite": "blue",
}


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _secs(x: float | None) -> str:
    return "not in the log" if x is None else f"{x:.1f} s"


def _overview(s: RunSummary) -> Table:
    t = Table(title="run", show_header=False, show_edge=False)
    t.add_column(style="bold")
    t.add_column()
    x = s.executions
    t.add_row("events", f"{s.events} (seq {s.first_seq}..{s.last_seq})" if s.events else "0")
    t.add_row("span", f"{s.time.span_s:.1f} s from {s.started_at or '—'}")
    t.add_row("skills", f"{s.skills_accepted} accepted, {s.skills_rejected} rejected")
    t.add_row("tasks", f"{s.tasks} ({s.tasks_validated} validated, {s.tasks_rejected} rejected)")
    t.add_row("hardening", f"{s.too_easy} too easy, {len(s.hardenings)} hardened")
    t.add_row("executions", f"{x.dispatched} dispatched, {x.running} running, {x.finished} finished")
    if x.by_status:
        t.add_row("  by status", ", ".join(f"{k} {v}" for k, v in x.by_status.items()))
    if x.by_failure_class:
        t.add_row("  by failure", ", ".join(f"{k} {v}" for k, v in x.by_failure_class.items()))
    t.add_row("reward", f"mean {_num(x.reward_mean)} over {x.scored} scored")
    if s.rewards_by_batch:  # known before the step trains: the live curve
        last = list(s.rewards_by_batch.items())[-4:]
        t.add_row("  by batch", ", ".join(f"step {k}: {m:.3f} ({n})" for k, (n, m) in last))
    t.add_row("watermark", _watermark_text(s))
    t.add_row("weights", ", ".join(v for _, v, _ in s.published) or "none published")
    return t


def _watermark_text(s: RunSummary) -> str:
    if not s.watermark:
        return "not in the log"
    w = s.watermark[-1]
    top = max(p.watermark for p in s.watermark)
    return f"w(t) {w.watermark}  CR(t) {w.rollout_capacity}  (peak w {top})"


def _steps(s: RunSummary, last: int | None = None) -> Table:
    t = Table(title="reward per training step")
    for col in ("step", "weights", "scored", "mean", "min", "max", "trained", "dropped", "loss"):
        t.add_column(col, justify="right")
    rows = s.steps if last is None else s.steps[-last:]
    for r in rows:
        t.add_row(
            str(r.step), r.weight_version or "—", str(r.count), _num(r.mean), _num(r.min), _num(r.max),
            str(r.trained), str(r.dropped), f"{r.loss:.4f}",
        )  # fmt: skip
    return t


def _cells(s: RunSummary) -> Table:
    t = Table(title="cells")
    for col in ("cell", "node", "capacity", "role", "since", "changes"):
        t.add_column(col)
    for c in s.cells:
        style = ROLE_STYLE.get(c.role, "")
        role = Text(c.role + (" (resident)" if c.resident else ""), style=style)
        t.add_row(c.cell_id, c.node, str(c.capacity), role, f"{c.since_s:.1f} s", str(c.changes))
    return t


def _difficulty(s: RunSummary) -> Table:
    t = Table(title="task difficulty per round")
    for col in ("round", "task versions", "patterns/task", "knob means", "scored", "reward"):
        t.add_column(col)
    for d in s.difficulty:
        knobs = ", ".join(f"{k}={v:.3g}" for k, v in d.knobs.items()) or "—"
        t.add_row(str(d.round), str(d.tasks), f"{d.patterns_mean:.2f}", knobs, str(d.executions), _num(d.reward_mean))
    return t


def _time(s: RunSummary) -> Table:
    t = Table(title="where time went (wall clock; kinds overlap when streaming)")
    t.add_column("kind")
    t.add_column("seconds", justify="right")
    t.add_column("of span", justify="right")
    span = s.time.span_s
    for name, v in (
        ("synthesis", s.time.synthesis_s),
        ("rollout", s.time.rollout_s),
        ("training", s.time.training_s),
        ("switching", s.time.switching_s),
    ):
        t.add_row(name, _secs(v), "—" if v is None or span <= 0 else f"{100 * v / span:.0f}%")
    if s.time.cell_seconds:
        t.add_row("cell-seconds", ", ".join(f"{k} {v:.1f}" for k, v in s.time.cell_seconds.items()), "")
    u = s.cell_use
    if u is not None:  # over the loop's window (first dispatch to last step), shares of cells x window
        t.add_row(
            "cell-idle",
            f"{100 * u.idle:.0f}% of {u.cells} cells x {u.window_s:.1f} s (rollout slots {100 * u.rollout_idle:.0f}%, "
            f"training {100 * u.training_idle:.0f}%); busy {100 * u.busy:.0f}%, switching {100 * u.switching:.0f}%",
            "",
        )
    return t


def _hardenings(s: RunSummary, last: int | None = None) -> Table:
    t = Table(title="hardening")
    for col in ("at", "task", "version", "mean reward", "bypassed"):
        t.add_column(col)
    rows = s.hardenings if last is None else s.hardenings[-last:]
    for h in rows:
        t.add_row(f"{h.at_s:.1f} s", h.task_id, f"{h.from_version} → {h.to_version}", _num(h.mean_reward), h.bypassed)
    return t


def _versions(s: RunSummary) -> Table:
    t = Table(title="model calls by weight version")
    for col in ("weights", "calls", "prompt tokens", "output tokens"):
        t.add_column(col, justify="right")
    for v in s.weight_versions:
        t.add_row(v.weight_version, str(v.calls), str(v.prompt_tokens), str(v.output_tokens))
    return t


def _notes(s: RunSummary) -> RenderableType:
    lines = [Text(f"• {n}", style="dim") for n in s.notes]
    lines += [Text(f"! {k}: {v}", style="bold red") for k, v in s.anomalies.items()]
    return Group(*lines)


def summary_table(s: RunSummary) -> RenderableType:
    """Every table of the report, for ``console.print`` at the end of a run."""
    parts: list[RenderableType] = [_overview(s)]
    if s.steps:
        parts.append(_steps(s))
    if s.cells:
        parts.append(_cells(s))
    if s.difficulty:
        parts.append(_difficulty(s))
    if s.hardenings:
        parts.append(_hardenings(s))
    parts.append(_time(s))
    if s.weight_versions:
        parts.append(_versions(s))
    if s.notes or s.anomalies:
        parts.append(_notes(s))
    return Group(*parts)


def dashboard_view(s: RunSummary, *, title: str = "OpenGyre run") -> RenderableType:
    """The live view: overview and cells, the latest steps and hardenings."""
    body: list[RenderableType] = [_overview(s)]
    if s.cells:
        body.append(_cells(s))
    if s.steps:
        body.append(_steps(s, last=6))
    if s.hardenings:
        body.append(_hardenings(s, last=4))
    if s.anomalies:
        body.append(_notes(s))
    return Panel(Group(*body), title=f"{title} · seq {s.last_seq}", border_style="cyan")
