"""Run reports from the event log alone: a fold of a run's events into a summary, a live rich dashboard that
follows the log, end-of-run tables and a self-contained HTML report with plots. Works on any run's log: live or
finished, the in-process demo or a multi-process stack.

The HTML report's names (``render_html``, ``write_html``, ``PLOTS``) load matplotlib on first use: the CLI imports
this package on every command and must not pay for it.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._fold import FOLDED_TYPES, RunFold, fold_events
from ._live import LiveDashboard, live_dashboard
from ._model import (
    CellSpan,
    CellUse,
    CellView,
    ExecutionTally,
    HardeningView,
    RoundDifficulty,
    RunSummary,
    StepRewards,
    TimeSplit,
    VersionCalls,
    WatermarkPoint,
)
from ._read import fold_log, summarize
from ._tables import dashboard_view, summary_table

if TYPE_CHECKING:
    from ._html import render_html, write_html
    from ._plots import PLOTS

__getattr__ = lazy_exports(__name__, {"render_html": "_html", "write_html": "_html", "PLOTS": "_plots"})

__all__ = [
    "FOLDED_TYPES",
    "PLOTS",
    "CellSpan",
    "CellUse",
    "CellView",
    "ExecutionTally",
    "HardeningView",
    "LiveDashboard",
    "RoundDifficulty",
    "RunFold",
    "RunSummary",
    "StepRewards",
    "TimeSplit",
    "VersionCalls",
    "WatermarkPoint",
    "dashboard_view",
    "fold_events",
    "fold_log",
    "live_dashboard",
    "render_html",
    "summarize",
    "summary_table",
    "write_html",
]
