"""The replay-vs-synthetic E2EL MAPE on inputs worked by hand, and runs that are not two forms of one workload
refused with the difference named."""

from __future__ import annotations

from typing import Any

import pytest

from opengyre.bench import CompareError, RequestResult, check_comparable, e2el_mape, mape_spread, workload_record


def _req(session: str, turn: int, e2el: float, ok: bool = True) -> RequestResult:
    return RequestResult(session, turn, 0.0, 0.0, ttft=e2el / 2, e2el=e2el, ok=ok)


def _run(times: dict[int, list[float]], prefix: str = "s") -> list[RequestResult]:
    """Turn index -> E2EL of that turn in sessions 0, 1, 2, ..."""
    return [_req(f"{prefix}{i}", k, t) for k, ts in times.items() for i, t in enumerate(ts)]


def test_the_per_turn_mape_averages_each_turns_mean_error() -> None:
    a = _run({1: [1.0, 1.0, 1.0], 2: [2.0, 2.0, 2.0], 3: [4.0]})
    # turn 1: mean 1.2 vs 1.0 (20 %); turn 2: mean 1.9 vs 2.0 (5 %); turn 3 has 1 request: left out
    b = _run({1: [1.1, 1.2, 1.3], 2: [1.8, 1.9, 2.0], 3: [40.0]}, prefix="x")
    m = e2el_mape(a, b)
    assert m["turns_compared"] == [1, 2]
    assert m["per_turn_mape"] == pytest.approx((0.2 + 0.05) / 2)
    assert m["per_turn_error"] == {"1": pytest.approx(0.2), "2": pytest.approx(0.05)}
    assert m["paired_mape"] is None  # other sessions: no request has a partner
    assert m["requests_a"] == 7 and m["requests_b"] == 7
    # with the single-request turn admitted, its 900 % error enters the mean
    assert e2el_mape(a, b, min_per_turn=1)["per_turn_mape"] == pytest.approx((0.2 + 0.05 + 9.0) / 3)


def test_a_uniform_slowdown_is_the_same_error_in_every_alignment() -> None:
    a = _run({1: [1.0, 2.0, 3.0, 5.0], 2: [2.0, 3.0, 7.0, 11.0]})
    b = _run({1: [1.1, 2.2, 3.3, 5.5], 2: [2.2, 3.3, 7.7, 12.1]})
    m = e2el_mape(a, b)
    assert m["per_turn_mape"] == pytest.approx(0.1)
    assert m["quantile_mape"] == pytest.approx(0.1)
    assert m["paired_mape"] == pytest.approx(0.1)  # same sessions and turns: paired request by request
    assert e2el_mape(a, a)["per_turn_mape"] == 0.0


def test_failed_requests_do_not_count_and_nothing_to_compare_is_refused() -> None:
    a = _run({1: [1.0, 1.0, 1.0]})
    b = [*_run({1: [1.5, 1.5, 1.5]}), _req("late", 1, 100.0, ok=False)]
    assert e2el_mape(a, b)["per_turn_mape"] == pytest.approx(0.5)
    with pytest.raises(CompareError, match="no turn index reached by both runs with at least 3"):
        e2el_mape(a, _run({1: [1.0, 1.0]}))
    with pytest.raises(CompareError, match="successful requests"):
        e2el_mape(a, [_req("s", 1, 1.0, ok=False)])
    with pytest.raises(CompareError, match="no MAPE values"):
        mape_spread([])
    assert mape_spread([0.1, 0.3]) == {"mean": pytest.approx(0.2), "min": 0.1, "max": 0.3, "n": 2}


def _doc(workload: dict[str, Any], **config: Any) -> dict[str, Any]:
    base = {"url": "http://h:1", "model": "m", "concurrency": 2, "rate": None, "workers": 1}
    return {"workload": workload, "config": {**base, **config}, "summary": {}}


def test_runs_of_other_workloads_servers_or_load_are_refused() -> None:
    trace = [{"id": "0", "conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}]
    other = [{"id": "0", "conversations": [{"from": "human", "value": "ho"}, {"from": "gpt", "value": "yo"}]}]
    replay = workload_record("replay", trace=trace, trace_name="t.json")
    synth = workload_record("synthetic", trace=trace, trace_name="t.json", profile={"name": "t"})
    check_comparable(_doc(replay), _doc(synth))  # two forms of one trace: fine
    check_comparable(_doc(replay), _doc(replay))  # replay twice: the noise floor
    with pytest.raises(CompareError, match=r"forms of different workloads: A is replay of trace:\w+ \(t.json\)"):
        check_comparable(_doc(replay), _doc(workload_record("synthetic", trace=other, trace_name="u.json")))
    chat = workload_record("synthetic", profile={"name": "chat"})
    with pytest.raises(CompareError, match="B is synthetic of profile:"):
        check_comparable(_doc(replay), _doc(chat))
    with pytest.raises(CompareError, match="differ in concurrency: A 2, B 4"):
        check_comparable(_doc(replay), _doc(synth, concurrency=4))
    with pytest.raises(CompareError, match="differ in url"):
        check_comparable(_doc(replay), _doc(synth, url="http://other:1"))
    with pytest.raises(CompareError, match="run B records no workload"):
        check_comparable(_doc(replay), {"config": {}, "summary": {}})
    with pytest.raises(CompareError, match="form must be one of replay, shadow, synthetic"):
        workload_record("exact", trace=trace)
