"""The HTML report: one self-contained file (figures inline as base64 SVG images, tables, no external asset)."""

from __future__ import annotations

import base64
from html import escape
from pathlib import Path

from ._model import RunSummary
from ._plots import PLOTS, render_plot

__all__ = ["render_html", "write_html"]

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 62em; color: #222; }
h1 { margin-bottom: 0.2em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }
th { background: #f4f4f4; } td:first-child, th:first-child { text-align: left; }
figure { margin: 0.8em 0; } figure img { max-width: 100%; } figcaption { color: #555; font-size: 0.9em; }
.missing { color: #a33; } .note { color: #555; } .anomaly { color: #a00; font-weight: bold; }
"""


def _num(x: float | None, fmt: str = ".3f") -> str:
    return "—" if x is None else format(x, fmt)


def _table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _overview(s: RunSummary) -> str:
    x = s.executions
    last = s.watermark[-1] if s.watermark else None
    rows = [
        ["events", f"{s.events} (seq {s.first_seq}..{s.last_seq})"],
        ["started", s.started_at or "—"],
        ["span", f"{s.time.span_s:.1f} s"],
        ["skills", f"{s.skills_accepted} accepted, {s.skills_rejected} rejected"],
        ["tasks", f"{s.tasks} ({s.tasks_validated} validated, {s.tasks_rejected} rejected)"],
        ["hardening", f"{s.too_easy} too easy, {len(s.hardenings)} hardened"],
        ["executions", f"{x.dispatched} dispatched, {x.running} running, {x.finished} finished"],
        ["by status", ", ".join(f"{k} {v}" for k, v in x.by_status.items()) or "—"],
        ["by failure class", ", ".join(f"{k} {v}" for k, v in x.by_failure_class.items()) or "—"],
        ["reward", f"mean {_num(x.reward_mean)} over {x.scored} scored"],
        ["watermark at the end", f"w(t) {last.watermark}, CR(t) {last.rollout_capacity}" if last else "—"],
        ["weights published", ", ".join(f"{v} (step {st})" for st, v, _ in s.published) or "none"],
        ["events by type", ", ".join(f"{k} {v}" for k, v in s.by_type.items()) or "—"],
    ]
    return _table(["", ""], rows)


def _sections(s: RunSummary) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = [
        (
            "Reward per training step",
            _table(
                ["step", "weights", "scored", "mean", "min", "max", "trained", "dropped", "unscored", "loss"],
                [
                    [
                        str(r.step),
                        r.weight_version or "—",
                        str(r.count),
                        _num(r.mean),
                        _num(r.min),
                        _num(r.max),
                        str(r.trained),
                        str(r.dropped),
                        str(r.unscored),
                        f"{r.loss:.4f}",
                    ]
                    for r in s.steps
                ],
            ),
        ),
        (
            "Cells",
            _table(
                ["cell", "node", "capacity", "resident", "role now", "since (s)", "role changes"],
                [
                    [c.cell_id, c.node, str(c.capacity), str(c.resident), c.role, f"{c.since_s:.1f}", str(c.changes)]
                    for c in s.cells
                ],
            ),
        ),
        (
            "Task difficulty per round",
            _table(
                ["round", "task versions", "patterns per task", "knob means", "scored executions", "mean reward"],
                [
                    [
                        str(d.round),
                        str(d.tasks),
                        f"{d.patterns_mean:.2f}",
                        ", ".join(f"{k}={v:.3g}" for k, v in d.knobs.items()) or "—",
                        str(d.executions),
                        _num(d.reward_mean),
                    ]
                    for d in s.difficulty
                ],
            ),
        ),
        (
            "Hardening",
            _table(
                ["at (s)", "task", "versions", "too-easy mean reward", "bypassed", "reason"],
                [
                    [
                        f"{h.at_s:.1f}",
                        h.task_id,
                        f"{h.from_version} → {h.to_version}",
                        _num(h.mean_reward),
                        h.bypassed,
                        h.reason,
                    ]
                    for h in s.hardenings
                ],
            ),
        ),
        (
            "Where time went",
            _table(
                ["kind", "seconds", "of span"],
                [
                    [
                        k,
                        _num(v, ".1f") if v is not None else "not in the log",
                        f"{100 * v / s.time.span_s:.0f}%" if v is not None and s.time.span_s > 0 else "—",
                    ]
                    for k, v in (
                        ("synthesis", s.time.synthesis_s),
                        ("rollout", s.time.rollout_s),
                        ("training", s.time.training_s),
                        ("switching", s.time.switching_s),
                    )
                ]
                + [[f"cell-seconds {r}", f"{v:.1f}", ""] for r, v in s.time.cell_seconds.items()],
            ),
        ),
        (
            "Model calls by weight version",
            _table(
                ["weights", "calls", "prompt tokens", "output tokens"],
                [
                    [v.weight_version, str(v.calls), str(v.prompt_tokens), str(v.output_tokens)]
                    for v in s.weight_versions
                ],
            ),
        ),
    ]
    return out


def render_html(s: RunSummary, *, title: str = "OpenGyre run report") -> str:
    """The report as one HTML document."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>{escape(title)}</h1>",
        f'<p class="note">Folded from the event log, seq {s.first_seq}..{s.last_seq}; every figure is derived '
        "from the events, and what the log does not hold is said, not drawn.</p>",
        "<h2>Run</h2>",
        _overview(s),
    ]
    if s.notes or s.anomalies:
        parts.append("<h2>What the log does not show</h2><ul>")
        parts += [f'<li class="note">{escape(n)}</li>' for n in s.notes]
        parts += [f'<li class="anomaly">{escape(k)}: {v}</li>' for k, v in s.anomalies.items()]
        parts.append("</ul>")
    parts.append("<h2>Plots</h2>")
    for pid, (name, caption, plot) in PLOTS.items():
        svg, why = render_plot(s, plot)
        if svg is None:
            body = f'<p class="missing">No figure: {escape(why)}.</p>'
        else:
            data = base64.b64encode(svg.encode()).decode("ascii")
            body = f'<img alt="{escape(name)}" src="data:image/svg+xml;base64,{data}">'
        parts.append(
            f'<figure id="plot-{pid}"><h3>{escape(name)}</h3>{body}<figcaption>{escape(caption)}</figcaption></figure>'
        )
    for heading, table in _sections(s):
        parts += [f"<h2>{escape(heading)}</h2>", table]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(s: RunSummary, path: Path | str, *, title: str = "OpenGyre run report") -> Path:
    """Write the report to ``path`` (parents created); the path written."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_html(s, title=title), encoding="utf-8")
    return out
