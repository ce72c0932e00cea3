"""A closed-loop sweep over concurrency that stops at saturation and reports the collapse beyond it.

Throughput at each C is taken over the steady part of a run: from its start until the last session was handed
to a slot (after that fewer than C sessions remain and the load thins out).

Only complete repeats count. A repeat with any failed request or unfinished session is *failed*: it is kept in
the result (marked, with its errors) but feeds no throughput, no C* and no collapse, and the sweep is partial. A
point none of whose repeats succeeded ends the sweep there (the server is gone or refusing): nothing past it
is measured, and the curve is the points before it.

C* is the first C whose step to the next C gains less than ``tolerance`` (relative). Each step is tested: the
95 % Welch interval of the gain (on log throughputs, so it is a ratio and never implies a negative rate) is
*rising* when its lower end is at least ``tolerance``, *flat* when its upper end is below it, else
*undecided* — and an undecided step gets more repeats at both of its points, up to ``max_repeats``. What
stays undecided at the cap is reported as such: ``compatible`` is every C that the tests do not rule out as C*
(no earlier step surely flat, its own step not surely rising), and C* is decided when that set is C* alone.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._load import RunResult

__all__ = ["SweepPoint", "SweepResult", "SweepStep", "find_saturation", "steady_throughput", "step_gain", "sweep"]

# two-sided 95 % Student t quantiles by degrees of freedom; a fractional Welch df is rounded down (conservative)
_T95 = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
]  # fmt: skip


def _t95(df: float) -> float:
    if df < 1:
        return _T95[0]
    i = math.floor(df)
    return _T95[i - 1] if i <= len(_T95) else 1.96


def steady_throughput(run: RunResult) -> float:
    """Requests per second completed while every slot still had a session to run."""
    ok = [r for r in run.requests if r.ok and r.e2el is not None]
    firsts = [r.scheduled for r in run.requests if r.turn == 1]
    if not ok or not firsts:
        return 0.0
    end = max(firsts)
    done = [r for r in ok if r.sent + (r.e2el or 0) <= end]
    if end - run.started <= 0 or len(done) < max(3, len(ok) // 4):
        # too little before the last dispatch (a sweep point with few sessions): the whole run instead
        return len(ok) / max(run.finished - run.started, 1e-9)
    return len(done) / (end - run.started)


def _log_stats(xs: Sequence[float]) -> tuple[float, float, int]:
    """Mean and variance of the logs (variance nan below two values)."""
    logs = [math.log(x) for x in xs]
    n = len(logs)
    m = sum(logs) / n
    var = sum((v - m) ** 2 for v in logs) / (n - 1) if n > 1 else math.nan
    return m, var, n


@dataclass
class SweepPoint:
    concurrency: int
    throughputs: list[float]  # request/s, one per complete repeat
    summaries: list[dict[str, Any]] = field(default_factory=list)  # of the complete repeats
    # the repeats that failed (any failed request or unfinished session): never in the throughputs
    failed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def attempts(self) -> int:
        return len(self.throughputs) + len(self.failed)

    @property
    def mean(self) -> float:
        """Mean throughput of the complete repeats; nan when none succeeded."""
        return sum(self.throughputs) / len(self.throughputs) if self.throughputs else math.nan

    @property
    def interval(self) -> tuple[float, float] | None:
        """95 % interval of the throughput (geometric, from the logs: always positive); None below 2 repeats."""
        if len(self.throughputs) < 2:
            return None
        m, var, n = _log_stats(self.throughputs)
        half = _t95(n - 1) * math.sqrt(var / n)
        return math.exp(m - half), math.exp(m + half)


def step_gain(a: Sequence[float], b: Sequence[float]) -> tuple[float, tuple[float, float] | None]:
    """Relative gain of throughputs ``b`` over ``a`` (ratio of means − 1) and its 95 % Welch interval on the
    logs (None unless both have two or more values)."""
    gain = (sum(b) / len(b)) / (sum(a) / len(a)) - 1
    if len(a) < 2 or len(b) < 2:
        return gain, None
    ma, va, na = _log_stats(a)
    mb, vb, nb = _log_stats(b)
    se2 = va / na + vb / nb
    if se2 == 0:
        return gain, (math.exp(mb - ma) - 1, math.exp(mb - ma) - 1)
    df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
    half = _t95(df) * math.sqrt(se2)
    return gain, (math.exp(mb - ma - half) - 1, math.exp(mb - ma + half) - 1)


def _first_error(p: SweepPoint) -> str:
    errors: list[str] = sorted({str(e) for f in p.failed for e in f["errors"]})
    if not errors:
        return "no throughput"
    return errors[0] + (f"; and {len(errors) - 1} other error(s), in sweep.json" if len(errors) > 1 else "")


@dataclass(frozen=True)
class SweepStep:
    """The step from one measured C to the next: its gain, the gain's interval and the test's verdict."""

    low: int
    high: int
    gain: float
    interval: tuple[float, float] | None
    verdict: str  # rising | flat | undecided

    @classmethod
    def between(cls, a: SweepPoint, b: SweepPoint, tolerance: float) -> SweepStep:
        gain, ci = step_gain(a.throughputs, b.throughputs)
        verdict = "undecided"
        if ci is not None and ci[0] >= tolerance:
            verdict = "rising"
        elif ci is not None and ci[1] < tolerance:
            verdict = "flat"
        return cls(a.concurrency, b.concurrency, gain, ci, verdict)


def find_saturation(cs: Sequence[int], means: Sequence[float], tolerance: float) -> int | None:
    """The first C whose throughput gain to the next point is below ``tolerance`` of its own; None if none."""
    for i in range(len(cs) - 1):
        if means[i] > 0 and (means[i + 1] - means[i]) / means[i] < tolerance:
            return cs[i]
    return None


@dataclass
class SweepResult:
    points: list[SweepPoint]  # every point measured, the failed one that stopped the sweep included
    tolerance: float
    c_star: int | None  # the point estimate: the first step whose mean gain is below tolerance
    compatible: list[int]  # every C the step tests do not rule out as C*
    collapse: float | None  # relative throughput drop from C* to the lowest point measured beyond it
    steps: list[SweepStep] = field(default_factory=list)
    max_repeats: int = 0
    stopped: str | None = None  # why the sweep ended early (a point with no complete repeat)

    @property
    def curve(self) -> list[SweepPoint]:
        """The points that count: those before the first point without a complete repeat."""
        out: list[SweepPoint] = []
        for p in self.points:
            if not p.throughputs:
                break
            out.append(p)
        return out

    @property
    def partial(self) -> bool:
        return any(p.failed for p in self.points)

    @property
    def decided(self) -> bool:
        return self.c_star is not None and self.compatible == [self.c_star]

    @property
    def rises_beyond(self) -> list[int]:
        """C beyond C* whose step is surely rising: the plateau at C* did not hold (a dip, or a noisy machine)."""
        if self.c_star is None:
            return []
        return [st.low for st in self.steps if st.low > self.c_star and st.verdict == "rising"]

    @property
    def c_star_range(self) -> tuple[int, int] | None:
        return (min(self.compatible), max(self.compatible)) if self.compatible else None

    def to_dict(self) -> dict[str, Any]:
        rng = self.c_star_range
        return {
            "tolerance": self.tolerance,
            "max_repeats": self.max_repeats,
            "c_star": self.c_star,
            "c_star_decided": self.decided,
            "c_star_compatible": self.compatible,
            "c_star_range": list(rng) if rng else None,
            "collapse_beyond_c_star": self.collapse,
            "rises_beyond_c_star": self.rises_beyond,
            "saturated": self.c_star is not None,
            "partial": self.partial,
            "failed_repeats": sum(len(p.failed) for p in self.points),
            "stopped": self.stopped,
            "steps": [
                {
                    "from": s.low,
                    "to": s.high,
                    "gain": s.gain,
                    "gain_ci95": list(s.interval) if s.interval else None,
                    "verdict": s.verdict,
                }
                for s in self.steps
            ],
            "points": [
                {
                    "concurrency": p.concurrency,
                    "request_throughput_mean": None if not p.throughputs else p.mean,
                    "request_throughput_ci95": list(iv) if (iv := p.interval) else None,
                    "repeats": p.throughputs,
                    "failed_repeats": p.failed,
                    "summaries": p.summaries,
                }
                for p in self.points
            ],
        }


def _analyse(
    points: list[SweepPoint], tolerance: float, max_repeats: int = 0, stopped: str | None = None
) -> SweepResult:
    """C*, the C compatible with it and the collapse, from the complete repeats of the measured points."""
    res = SweepResult(points, tolerance, None, [], None, max_repeats=max_repeats, stopped=stopped)
    curve = res.curve
    res.steps = [SweepStep.between(a, b, tolerance) for a, b in itertools.pairwise(curve)]
    res.c_star = find_saturation([p.concurrency for p in curve], [p.mean for p in curve], tolerance)
    for s in res.steps:
        if s.verdict != "rising":
            res.compatible.append(s.low)
        if s.verdict == "flat":
            break  # no later C can be the first flat one
    if res.c_star is not None:
        i = [p.concurrency for p in curve].index(res.c_star)
        base = curve[i].mean
        after = [p.mean for p in curve[i + 1 :]]
        res.collapse = (base - min(after)) / base if after and base > 0 else None
    return res


async def sweep(
    run_at: Callable[[int, int], Awaitable[tuple[RunResult, dict[str, Any]]]],
    concurrencies: Sequence[int],
    *,
    repeats: int = 2,
    max_repeats: int | None = None,
    tolerance: float = 0.05,
    beyond: int = 2,
    progress: Callable[[SweepPoint], None] | None = None,
) -> SweepResult:
    """Run ``run_at(C, repeat)`` over increasing C until C* is found and ``beyond`` more points are measured;
    a step the test cannot decide gets more repeats at both ends, up to ``max_repeats`` runs per point
    (default: ``repeats``, i.e. no more)."""
    cap = repeats if max_repeats is None else max_repeats
    if repeats <= 0 or cap < repeats:
        raise ValueError(f"repeats must be positive and max_repeats at least repeats, got {repeats} and {cap}")
    if not concurrencies or sorted(set(concurrencies)) != list(concurrencies) or concurrencies[0] <= 0:
        raise ValueError("concurrencies must be positive and strictly increasing")
    if not (math.isfinite(tolerance) and tolerance > 0):
        raise ValueError(f"tolerance must be positive, got {tolerance}")
    if beyond < 0:
        raise ValueError(f"beyond must be >= 0, got {beyond}")

    async def measure(p: SweepPoint) -> None:
        rep = p.attempts
        run, summary = await run_at(p.concurrency, rep)
        x = steady_throughput(run)
        if run.partial or not x > 0:
            p.failed.append(
                {
                    "repeat": rep,
                    "requests_ok": summary.get("requests_ok"),
                    "requests_failed": summary.get("requests_failed"),
                    "sessions_planned": run.sessions_planned,
                    "sessions_completed": run.sessions_completed,
                    "errors": run.errors,
                }
            )
        else:
            p.throughputs.append(x)
            p.summaries.append(summary)

    points: list[SweepPoint] = []
    stopped: str | None = None
    for c in concurrencies:
        p = SweepPoint(c, [])
        for _ in range(repeats):
            await measure(p)
        points.append(p)
        if progress:
            progress(p)
        if not p.throughputs:
            stopped = f"no complete repeat at C={c} ({_first_error(p)}): the sweep stopped there"
            break
        if len(points) >= 2:
            # power: repeat both ends of an undecided step until its interval clears the tolerance, or the cap
            a, b = points[-2], points[-1]
            while SweepStep.between(a, b, tolerance).verdict == "undecided":
                open_ = [q for q in (a, b) if q.attempts < cap]
                if not open_:
                    break
                q = min(open_, key=lambda q: (len(q.throughputs), q.attempts))  # the end with less data
                await measure(q)
                if progress:
                    progress(q)
        found = _analyse(points, tolerance)
        closed = any(st.verdict == "flat" for st in found.steps)  # no later C can be compatible
        if found.c_star is not None and closed:
            # ``beyond`` points past every C still compatible: an undecided C* keeps the sweep going
            last = max([found.c_star, *found.compatible])
            if len(points) - 1 - [q.concurrency for q in points].index(last) >= beyond:
                break
    return _analyse(points, tolerance, cap, stopped)
