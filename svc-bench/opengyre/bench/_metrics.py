"""Summaries of a run: latency percentiles per request and per turn index, throughput, goodput under SLOs."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._load import RequestResult, RunResult

__all__ = ["Slo", "cross_check_tokens", "percentiles", "summarise"]

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2el_s: float | None = None

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        checks = ((self.ttft_s, r.ttft), (self.tpot_s, r.tpot), (self.e2el_s, r.e2el))
        return all(limit is None or (v is not None and v <= limit) for limit, v in checks)


def percentiles(values: Iterable[float], ps: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, float]:
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return {"n": 0}
    out: dict[str, float] = {"n": int(arr.size), "mean": float(arr.mean())}
    for p in ps:
        out[f"p{p:g}"] = float(np.percentile(arr, p))
    return out


def summarise(run: RunResult, slo: Slo | None = None, ps: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    ok = [r for r in run.requests if r.ok]
    dur = max(run.finished - run.started, 1e-9)
    out_tokens = sum(r.output_tokens or 0 for r in ok)
    in_tokens = sum(r.prompt_tokens or 0 for r in ok)
    per_turn: dict[int, list[RequestResult]] = {}
    for r in ok:
        per_turn.setdefault(r.turn, []).append(r)
    summary: dict[str, Any] = {
        "partial": run.partial,
        "errors": run.errors,
        "requests_ok": len(ok),
        "requests_failed": len(run.requests) - len(ok),
        "sessions_planned": run.sessions_planned,
        "sessions_completed": run.sessions_completed,
        "duration_s": dur,
        "request_throughput": len(ok) / dur,
        "output_token_throughput": out_tokens / dur,
        "total_token_throughput": (in_tokens + out_tokens) / dur,
        "ttft_s": percentiles((r.ttft for r in ok), ps),  # type: ignore[misc]
        "tpot_s": percentiles((r.tpot for r in ok), ps),  # type: ignore[misc]
        "itl_s": percentiles((x for r in ok for x in r.itl), ps),
        "e2el_s": percentiles((r.e2el for r in ok), ps),  # type: ignore[misc]
        "queue_s": percentiles((r.queue_s for r in run.requests), ps),
        "isl_tokens": percentiles((r.prompt_tokens for r in ok), ps),  # type: ignore[misc]
        "osl_tokens": percentiles((r.output_tokens for r in ok), ps),  # type: ignore[misc]
        "output_short_of_max": sum(1 for r in ok if (r.output_tokens or 0) < r.max_tokens),
        "per_turn": {
            str(k): {
                "n": len(v),
                "ttft_p50_s": float(np.median([r.ttft for r in v])),
                "e2el_p50_s": float(np.median([r.e2el for r in v])),
                "isl_mean": float(np.mean([r.prompt_tokens or 0 for r in v])),
            }
            for k, v in sorted(per_turn.items())
        },
        "client": {
            "loop_lag_max_s": run.loop_lag_max_s,
            "loop_lag_p99_s": run.loop_lag_p99_s,
            "bottleneck": run.client_bottleneck,
            "cpu_s": run.client_cpu_s,  # the load generator's own CPU while sending (every worker)
            "cpu_s_per_request": run.client_cpu_s / max(1, len(run.requests)),
        },
    }
    if slo is not None:
        good = [r for r in run.requests if slo.met(r)]
        summary["goodput"] = {
            "slo": {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "e2el_s": slo.e2el_s},
            "requests_per_s": len(good) / dur,
            "fraction": len(good) / max(1, len(run.requests)),
        }
    return summary


def cross_check_tokens(requests: Iterable[RequestResult], tokenizer: Any) -> dict[str, int]:
    """Compare the server's ``usage.prompt_tokens`` with the tokenizer's count of the templated prompt."""
    checked = mismatched = 0
    for r in requests:
        if not r.ok or r.messages is None or r.prompt_tokens is None:
            continue
        # render, then encode: apply_chat_template(tokenize=True) returns ids or a BatchEncoding by version
        text = tokenizer.apply_chat_template(list(r.messages), add_generation_prompt=True, tokenize=False)
        checked += 1
        if len(tokenizer.encode(text, add_special_tokens=False)) != r.prompt_tokens:
            mismatched += 1
    return {"checked": checked, "mismatched": mismatched}
