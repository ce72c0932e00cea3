"""Saturation detection: C* where throughput stops rising, its interval over repeats, the collapse beyond."""

from __future__ import annotations

from opengyre.bench import RequestResult, RunResult, find_saturation, steady_throughput, sweep


def _run(rate: float, n: int = 40) -> RunResult:
    """A closed-loop run completing ``rate`` requests/s, one session per request, all dispatched by the end."""
    reqs = [
        RequestResult(f"s{i}", 1, scheduled=i / rate, sent=i / rate, ttft=0.01, e2el=1 / rate, ok=True)
        for i in range(n)
    ]
    return RunResult(reqs, 0.0, (n + 1) / rate, n, n, 0.0, 0.0, False, [])


def test_find_saturation_is_the_first_flat_step() -> None:
    assert find_saturation([1, 2, 4, 8, 16], [10, 19, 30, 31, 20], 0.05) == 4
    assert find_saturation([1, 2, 4], [10, 19, 30], 0.05) is None


def test_steady_throughput_counts_completions_before_the_last_dispatch() -> None:
    assert abs(steady_throughput(_run(20.0)) - 20.0) < 1.0


async def test_sweep_stops_after_the_collapse_and_reports_it() -> None:
    curve = {1: 10.0, 2: 19.0, 4: 30.0, 8: 31.0, 16: 15.0, 32: 9.0, 64: 8.0}
    asked: list[int] = []

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, object]]:
        asked.append(c)
        return _run(curve[c] * (1 + 0.01 * rep)), {}

    res = await sweep(run_at, list(curve), repeats=2, tolerance=0.05, beyond=2)
    assert res.c_star == 4
    assert asked == [1, 1, 2, 2, 4, 4, 8, 8, 16, 16]  # C* found at 8; two points past C* and it stops
    assert res.c_star_ci == (4, 4)
    assert res.collapse is not None and 0.45 < res.collapse < 0.55  # 30 -> 15 req/s
    d = res.to_dict()
    assert d["saturated"] and d["points"][0]["request_throughput_ci95"] is not None
