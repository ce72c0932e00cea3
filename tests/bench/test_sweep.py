"""Saturation detection: C* where throughput stops rising, tested with power (repeats until a step's interval
clears the tolerance), the C compatible with it, the collapse beyond, and failed repeats kept out of all of it."""

from __future__ import annotations

import math
import random

import pytest

from opengyre.bench import (
    RequestResult,
    RunResult,
    SweepPoint,
    find_saturation,
    steady_throughput,
    step_gain,
    sweep,
)


def _run(rate: float, n: int = 40, failed: int = 0) -> RunResult:
    """A closed-loop run completing ``rate`` requests/s, one session per request, all dispatched by the end;
    the last ``failed`` requests failed."""
    reqs = [
        RequestResult(f"s{i}", 1, scheduled=i / rate, sent=i / rate, ttft=0.01, e2el=1 / rate, ok=i < n - failed)
        for i in range(n)
    ]
    for r in reqs[n - failed :]:
        r.error, r.e2el = "server closed the connection mid-stream after 3 chunks", None
    errors = sorted({r.error for r in reqs if r.error})
    return RunResult(reqs, 0.0, (n + 1) / rate, n, n - failed, 0.0, 0.0, False, errors)


def _summary(run: RunResult) -> dict[str, object]:
    ok = sum(r.ok for r in run.requests)
    return {"requests_ok": ok, "requests_failed": len(run.requests) - ok}


def test_find_saturation_is_the_first_flat_step() -> None:
    assert find_saturation([1, 2, 4, 8, 16], [10, 19, 30, 31, 20], 0.05) == 4
    assert find_saturation([1, 2, 4], [10, 19, 30], 0.05) is None


def test_steady_throughput_counts_completions_before_the_last_dispatch() -> None:
    assert abs(steady_throughput(_run(20.0)) - 20.0) < 1.0


def test_intervals_are_ratios_never_below_zero() -> None:
    p = SweepPoint(4, [0.1, 10.0, 0.2])  # wildly dispersed: a symmetric t interval would reach far below 0
    lo, hi = p.interval or (math.nan, math.nan)
    assert 0 < lo < p.mean < hi
    gain, ci = step_gain([10.0, 10.0], [12.0, 12.0])
    assert ci is not None and math.isclose(gain, 0.2) and math.isclose(ci[0], 0.2) and math.isclose(ci[1], 0.2)
    assert step_gain([10.0], [12.0, 12.0])[1] is None  # one repeat: no interval, never a verdict


async def test_sweep_stops_after_the_collapse_and_reports_it() -> None:
    curve = {1: 10.0, 2: 19.0, 4: 30.0, 8: 30.3, 16: 15.0, 32: 9.0, 64: 8.0}
    asked: list[int] = []

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        asked.append(c)
        r = _run(curve[c] * (1 + 0.001 * rep))
        return r, _summary(r)

    res = await sweep(run_at, list(curve), repeats=2, tolerance=0.05, beyond=2)
    assert res.c_star == 4 and res.decided and res.compatible == [4]
    assert asked == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]  # C* found at 8; two points past C* and it stops
    assert res.collapse is not None and 0.45 < res.collapse < 0.55  # 30 -> 15 req/s
    d = res.to_dict()
    assert d["saturated"] and not d["partial"] and d["c_star_range"] == [4, 4] and d["rises_beyond_c_star"] == []
    assert [s["verdict"] for s in d["steps"]] == ["rising", "rising", "flat", "flat"]
    assert d["points"][0]["request_throughput_ci95"][0] > 0


async def test_a_6_percent_step_is_not_taken_for_saturation_the_test_repeats_until_it_separates() -> None:
    """The issue's case: C = 2 is 6 % above C = 1 with 2 % noise; at tolerance 5 % two repeats cannot tell,
    so the sweep repeats both ends of the step until its interval clears 5 %, or reports it undecided."""
    curve = {1: 10.0, 2: 10.6, 4: 10.65, 8: 10.6}
    rng = random.Random(7)
    asked: list[int] = []

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        asked.append(c)
        r = _run(curve[c] * math.exp(rng.gauss(0, 0.004)), n=400)
        return r, _summary(r)

    res = await sweep(run_at, list(curve), repeats=2, max_repeats=12, tolerance=0.05, beyond=1)
    step = res.steps[0]
    assert step.verdict == "rising", step  # 6 % ± well under 1 %: separated from 5 %
    assert res.c_star == 2 and res.decided, res.to_dict()["steps"]
    assert asked.count(1) > 2, "the 1 -> 2 step needed more than two repeats to separate"

    # at the cap the same step is undecided: both C are reported compatible, C* is not decided
    rng = random.Random(7)
    curve[2] = 10.5  # exactly the tolerance: no number of repeats separates it
    res = await sweep(run_at, list(curve), repeats=2, max_repeats=4, tolerance=0.05, beyond=1)
    assert res.steps[0].verdict == "undecided" and res.compatible == [1, 2]  # 2 -> 4 is surely flat
    assert not res.decided and max(len(p.throughputs) for p in res.points) == 4


async def test_failed_repeats_feed_no_figure_and_a_dead_server_stops_the_sweep() -> None:
    """The issue's case: a repeat with 24 of 96 requests failed, then the engine killed: the failed repeat is
    marked and left out, the sweep stops at the first point with no complete repeat, and no C* or collapse
    comes out of what was never measured."""
    curve = {1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 16: 15.0}
    asked: list[int] = []

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        asked.append(c)
        if c == 2 and rep == 0:
            r = _run(90.0, n=96, failed=24)  # a fast-looking partial repeat: averaged in, it would move C*
        elif c >= 8:
            r = _run(1.0, n=4, failed=4)  # killed: every request fails
        else:
            r = _run(curve[c])
        return r, _summary(r)

    res = await sweep(run_at, list(curve), repeats=2, max_repeats=3, tolerance=0.05, beyond=2)
    assert asked == [1, 1, 2, 2, 2, 4, 4, 8, 8]  # C=2 got a third run (power: one complete repeat has no CI)
    p2 = res.points[1]
    assert len(p2.throughputs) == 2 and all(x < 20 for x in p2.throughputs)
    [failed] = p2.failed
    assert failed["repeat"] == 0 and failed["requests_failed"] == 24 and failed["requests_ok"] == 72
    assert all(len(p.throughputs) == 2 for p in res.points[:3])
    assert res.partial and res.stopped is not None and "no complete repeat at C=8" in res.stopped
    assert "server closed the connection" in res.stopped
    assert res.c_star is None and res.collapse is None  # not "C* = 4, collapse 1.0": nothing flat was measured
    d = res.to_dict()
    assert not d["saturated"] and d["failed_repeats"] == 3 and d["points"][-1]["request_throughput_mean"] is None


async def test_bad_sweep_parameters_are_refused() -> None:
    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        raise AssertionError("must not run")

    for kwargs, words in (
        ({"repeats": 0}, "repeats must be positive"),
        ({"repeats": 3, "max_repeats": 2}, "max_repeats at least repeats"),
        ({"tolerance": -0.1}, "tolerance must be positive"),
        ({"beyond": -1}, "beyond must be >= 0"),
    ):
        with pytest.raises(ValueError, match=words):
            await sweep(run_at, [1, 2], **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="strictly increasing"):
        await sweep(run_at, [2, 1])


async def test_a_surely_rising_step_past_c_star_says_the_plateau_did_not_hold() -> None:
    curve = {1: 10.0, 2: 20.0, 4: 20.1, 8: 40.0, 16: 40.0}

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        r = _run(curve[c] * (1 + 0.001 * rep))
        return r, _summary(r)

    res = await sweep(run_at, list(curve), repeats=2, tolerance=0.05, beyond=2)
    assert res.c_star == 2 and res.rises_beyond == [4] and res.to_dict()["rises_beyond_c_star"] == [4]
