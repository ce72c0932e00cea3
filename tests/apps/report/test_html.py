"""The HTML report: one parseable document holding every plot as an SVG image, and the tables' figures."""

from __future__ import annotations

import base64
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

from opengyre.events import SkillIngested
from opengyre.report import PLOTS, fold_events, render_html, write_html

from ._run import scripted_run

_VOID = {"meta", "img", "br", "hr", "link", "input"}


class _Checker(HTMLParser):
    """Tags must nest and close; collects the figures and their images."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.figures: dict[str, list[str]] = {}  # figure id -> image srcs inside it
        self.missing: dict[str, str] = {}
        self._figure: str | None = None
        self._in_missing = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "figure":
            self._figure = a["id"] or ""
            self.figures[self._figure] = []
        if tag == "img" and self._figure is not None:
            self.figures[self._figure].append(a["src"] or "")
        if tag == "p" and a.get("class") == "missing" and self._figure:
            self._in_missing = True
        if tag not in _VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()
        if tag == "figure":
            self._figure = None
        if tag == "p":
            self._in_missing = False

    def handle_data(self, data: str) -> None:
        if self._in_missing and self._figure:
            self.missing[self._figure] = self.missing.get(self._figure, "") + data


def _parse(html: str) -> _Checker:
    p = _Checker()
    p.feed(html)
    p.close()
    assert p.stack == [], f"unclosed: {p.stack}"
    return p


def test_the_report_holds_every_plot_as_a_valid_svg_and_the_tables(tmp_path: Path) -> None:
    events = scripted_run(4)
    s = fold_events(enumerate(events, 1))
    path = write_html(s, tmp_path / "out" / "report.html")
    html = path.read_text()
    p = _parse(html)
    assert set(p.figures) == {f"plot-{k}" for k in PLOTS} == {
        "plot-reward", "plot-roles", "plot-watermark", "plot-difficulty", "plot-time"
    }  # fmt: skip
    for fid, srcs in p.figures.items():
        assert len(srcs) == 1, fid
        head, data = srcs[0].split(",", 1)
        assert head == "data:image/svg+xml;base64"
        svg = ET.fromstring(base64.b64decode(data))
        assert svg.tag.endswith("svg") and len(list(svg.iter())) > 20, fid
    assert "http://" not in html.replace("http://www.w3.org", "") and "<script" not in html  # self-contained
    # The tables carry the fold's figures: each step's mean reward and each hardening.
    for r in s.steps:
        assert re.search(
            rf"<td>{r.step}</td><td>{re.escape(r.weight_version)}</td><td>{r.count}</td><td>{r.mean:.3f}</td>", html
        )
    assert html.count("→") >= len(s.hardenings)
    assert render_html(s) == html  # the same summary, the same bytes


def test_a_log_with_nothing_to_draw_says_so_in_each_figure() -> None:
    s = fold_events([(1, SkillIngested(skill_id="a", name="a", description="d"))])
    p = _parse(render_html(s))
    assert all(srcs == [] for srcs in p.figures.values())
    assert set(p.missing) == set(p.figures) and all(m.startswith("No figure: ") for m in p.missing.values())
