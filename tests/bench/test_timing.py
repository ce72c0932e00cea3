"""The latency ground truth: the client's TTFT, ITL and E2EL against a real HTTP server whose timing is known.

The server streams on deadlines from each request's start (400 ms to the first token, 40 ms per token after it)
and records when it actually wrote each token, on the client's monotonic clock. What the client measures is
checked against both as a relative error — a measurement check, not a time limit: medians against the nominal
timing (one late wake-up of a loaded machine moves one sample, not the median), and every request against what
the server really did.
"""

from __future__ import annotations

import statistics

from opengyre.bench import LoadConfig, SessionPlan, TimedServer, TurnPlan, run_load, summarise

TTFT, ITL, TOKENS = 0.400, 0.040, 12


def _plans(n: int) -> list[SessionPlan]:
    return [SessionPlan(f"s{i}", (TurnPlan(({"role": "user", "content": f"q{i}"},), TOKENS),)) for i in range(n)]


def _rel(measured: float, truth: float) -> float:
    return abs(measured / truth - 1)


async def test_client_measures_ttft_itl_e2el_within_2_percent_of_a_known_timing_server() -> None:
    srv = await TimedServer(TTFT, ITL).start()
    try:
        run = await run_load(LoadConfig(srv.url, "timed", concurrency=4, record_messages=True), _plans(12))
    finally:
        await srv.stop()
    assert not run.partial, run.errors
    assert len(run.requests) == 12 and all(r.output_tokens == TOKENS for r in run.requests)
    # every ITL sample is a gap between two tokens, never the role-only or the empty chunk's
    assert all(len(r.itl) == TOKENS - 1 for r in run.requests)

    e2el_truth = TTFT + (TOKENS - 1) * ITL
    medians = {
        "ttft": (statistics.median(r.ttft for r in run.requests if r.ttft is not None), TTFT),
        "itl": (statistics.median(x for r in run.requests for x in r.itl), ITL),
        "tpot": (statistics.median(r.tpot for r in run.requests if r.tpot is not None), ITL),
        "e2el": (statistics.median(r.e2el for r in run.requests if r.e2el is not None), e2el_truth),
    }
    off = {k: _rel(m, t) for k, (m, t) in medians.items()}
    assert all(e < 0.02 for e in off.values()), (off, medians)

    # per request, against the times the server recorded for it
    by_prompt = {rec.prompt: rec for rec in srv.records}
    for r in run.requests:
        rec = by_prompt[str(r.messages[-1]["content"])]  # type: ignore[index]
        actual_ttft = rec.tokens[0] - rec.received
        actual_gaps = statistics.median(b - a for a, b in zip(rec.tokens, rec.tokens[1:], strict=False))
        assert r.ttft is not None and r.e2el is not None
        assert r.ttft >= actual_ttft  # the client cannot see a token before the server wrote it
        assert _rel(r.ttft, actual_ttft) < 0.02, (r.ttft, actual_ttft)
        assert _rel(r.e2el, rec.finished - rec.received) < 0.02, (r.e2el, rec.finished - rec.received)
        assert _rel(statistics.median(r.itl), actual_gaps) < 0.02, (r.itl, actual_gaps)

    s = summarise(run)  # the summary reports the same measurement
    assert _rel(s["ttft_s"]["p50"], TTFT) < 0.02 and _rel(s["e2el_s"]["p50"], e2el_truth) < 0.02
