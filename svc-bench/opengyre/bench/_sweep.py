"""A closed-loop sweep over concurrency that stops at saturation and reports the collapse beyond it.

Throughput at each C is taken over the steady part of a run: from its start until the last session was handed
to a slot (after that fewer than C sessions remain and the load thins out). C* is the first C whose mean
request throughput rises by less than ``tolerance`` (relative) to the next C, i.e. dX/dC ≈ 0; repeats are
averaged and C*'s 95 % interval comes from resampling the repeats (a bootstrap over the measured runs).
"""

from __future__ import annotations

import math
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ._load import RunResult

__all__ = ["SweepPoint", "SweepResult", "find_saturation", "steady_throughput", "sweep"]

# two-sided 95 % Student t quantiles by degrees of freedom (1..10); 1.96 beyond
_T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}


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


@dataclass
class SweepPoint:
    concurrency: int
    throughputs: list[float]  # request/s, one per repeat
    summaries: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mean(self) -> float:
        return sum(self.throughputs) / len(self.throughputs)

    @property
    def ci95(self) -> float:
        n = len(self.throughputs)
        if n < 2:
            return math.nan
        m = self.mean
        sd = math.sqrt(sum((x - m) ** 2 for x in self.throughputs) / (n - 1))
        return _T95.get(n - 1, 1.96) * sd / math.sqrt(n)


def find_saturation(cs: Sequence[int], means: Sequence[float], tolerance: float) -> int | None:
    """The first C whose throughput gain to the next point is below ``tolerance`` of its own; None if none."""
    for i in range(len(cs) - 1):
        if means[i] > 0 and (means[i + 1] - means[i]) / means[i] < tolerance:
            return cs[i]
    return None


@dataclass
class SweepResult:
    points: list[SweepPoint]
    tolerance: float
    c_star: int | None
    c_star_ci: tuple[int, int] | None
    collapse: float | None  # relative throughput drop from C* to the last point measured beyond it

    def to_dict(self) -> dict[str, Any]:
        return {
            "tolerance": self.tolerance,
            "c_star": self.c_star,
            "c_star_ci95": list(self.c_star_ci) if self.c_star_ci else None,
            "collapse_beyond_c_star": self.collapse,
            "saturated": self.c_star is not None,
            "points": [
                {
                    "concurrency": p.concurrency,
                    "request_throughput_mean": p.mean,
                    "request_throughput_ci95": None if math.isnan(p.ci95) else p.ci95,
                    "repeats": p.throughputs,
                    "summaries": p.summaries,
                }
                for p in self.points
            ],
        }


def _analyse(points: list[SweepPoint], tolerance: float, seed: int = 0) -> SweepResult:
    cs = [p.concurrency for p in points]
    c_star = find_saturation(cs, [p.mean for p in points], tolerance)
    ci: tuple[int, int] | None = None
    collapse: float | None = None
    if c_star is not None:
        rng = random.Random(seed)
        draws: list[int] = []
        for _ in range(1000):
            means = [sum(rng.choices(p.throughputs, k=len(p.throughputs))) / len(p.throughputs) for p in points]
            c = find_saturation(cs, means, tolerance)
            draws.append(c if c is not None else cs[-1])
        draws.sort()
        ci = (draws[25], draws[974])
        i = cs.index(c_star)
        base = points[i].mean
        after = [p.mean for p in points[i + 1 :]]
        collapse = (base - min(after)) / base if after and base > 0 else None
    return SweepResult(points, tolerance, c_star, ci, collapse)


async def sweep(
    run_at: Callable[[int, int], Awaitable[tuple[RunResult, dict[str, Any]]]],
    concurrencies: Sequence[int],
    *,
    repeats: int = 1,
    tolerance: float = 0.05,
    beyond: int = 2,
    progress: Callable[[SweepPoint], None] | None = None,
) -> SweepResult:
    """Run ``run_at(C, repeat)`` over increasing C until C* is found and ``beyond`` more points are measured."""
    if repeats <= 0 or not concurrencies or sorted(set(concurrencies)) != list(concurrencies):
        raise ValueError("concurrencies must be strictly increasing and repeats positive")
    points: list[SweepPoint] = []
    for c in concurrencies:
        p = SweepPoint(c, [])
        for rep in range(repeats):
            run, summary = await run_at(c, rep)
            p.throughputs.append(steady_throughput(run))
            p.summaries.append(summary)
        points.append(p)
        if progress:
            progress(p)
        found = _analyse(points, tolerance)
        if found.c_star is not None and len(points) - 1 - [q.concurrency for q in points].index(found.c_star) >= beyond:
            break
    return _analyse(points, tolerance)
