"""Replay vs synthetic: the E2EL MAPE between two runs, and the check that the runs are two forms of one workload.

The paper (AgentPerfBench) reports the synthetic form's E2EL MAPE against exact replay (2.4 %) without saying how
requests are aligned. Synthesised sessions are other sessions (other turn counts, other lengths drawn from the same
distributions), so no request of one run has a partner in the other: the figure here aligns by **turn index** —
the mean E2EL at turn k of each run, for every k both runs reached with at least ``min_per_turn`` requests, and
the MAPE over those k. The turn index is what the snowball acts on (turn k's prompt holds every earlier turn), so
a synthetic form that misstates how contexts grow shows here. Beside it: the MAPE over the E2EL distribution's
quantiles p5..p95, and, where both runs sent the same requests (replay twice), the per-request MAPE.

A MAPE means something only against the noise floor of the same measurement: replay against replay.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from ._load import RequestResult

__all__ = [
    "FORMS",
    "CompareError",
    "check_comparable",
    "e2el_mape",
    "mape_spread",
    "workload_record",
]

# replay: the trace's messages; shadow: the trace's lengths with random tokens; synthetic: sessions drawn from a
# profile (fitted to the trace, or given)
FORMS = ("replay", "shadow", "synthetic")
MIN_PER_TURN = 3
# what two runs must share to be compared: the same server and model, the same load shape
_SAME_RUN = ("url", "model", "concurrency", "rate", "workers")


class CompareError(ValueError):
    """Two runs that cannot be compared, or a comparison with nothing to compare; says which field differs."""


def _digest(doc: Any) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode()).hexdigest()[:16]


def workload_record(
    form: str, *, trace: Any = None, trace_name: str = "", profile: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """What a run sent, for ``run.json``: its form and the workload's identity (the trace's digest when the run
    is a form of a trace, else the profile's), so a later comparison can refuse runs of different workloads."""
    if form not in FORMS:
        raise CompareError(f"form must be one of {', '.join(FORMS)}, got {form!r}")
    if trace is not None:
        return {"form": form, "source": f"trace:{_digest(trace)}", "trace": trace_name, "profile": profile}
    if profile is None:
        raise CompareError("a workload needs a trace or a profile")
    return {"form": form, "source": f"profile:{_digest(profile)}", "trace": None, "profile": profile}


def check_comparable(a: Mapping[str, Any], b: Mapping[str, Any]) -> None:
    """Refuse, naming the difference, two ``run.json`` documents that are not two runs of one workload against
    one server under one load shape."""
    for name, doc in (("A", a), ("B", b)):
        if "workload" not in doc or "config" not in doc:
            raise CompareError(
                f"run {name} records no workload (run.json without 'workload'/'config': not written by "
                "`opengyre bench run`, or by a version before forms were recorded)"
            )
    wa, wb = a["workload"], b["workload"]
    if wa["source"] != wb["source"]:
        raise CompareError(
            f"the runs are forms of different workloads: A is {wa['form']} of {wa['source']}"
            f"{' (' + wa['trace'] + ')' if wa.get('trace') else ''}, B is {wb['form']} of {wb['source']}"
            f"{' (' + wb['trace'] + ')' if wb.get('trace') else ''}"
        )
    for k in _SAME_RUN:
        if a["config"].get(k) != b["config"].get(k):
            raise CompareError(f"the runs differ in {k}: A {a['config'].get(k)!r}, B {b['config'].get(k)!r}")


def _by_turn(rs: Iterable[RequestResult]) -> dict[int, list[float]]:
    d: dict[int, list[float]] = {}
    for r in rs:
        if r.ok and r.e2el is not None:
            d.setdefault(r.turn, []).append(r.e2el)
    return d


def e2el_mape(
    a: Sequence[RequestResult], b: Sequence[RequestResult], min_per_turn: int = MIN_PER_TURN
) -> dict[str, Any]:
    """E2EL MAPE of run B against reference run A (fractions, not percent).

    ``per_turn_mape``: over turn indexes both runs reached with ``min_per_turn`` successful requests or more,
    |mean_B(k) − mean_A(k)| / mean_A(k), averaged over k (the headline). ``quantile_mape``: over p5..p95 of each
    run's E2EL. ``paired_mape``: per request (session, turn), only when both runs sent the same requests, else None.
    """
    ta, tb = _by_turn(a), _by_turn(b)
    ea = np.asarray([x for v in ta.values() for x in v], dtype=float)
    eb = np.asarray([x for v in tb.values() for x in v], dtype=float)
    if ea.size == 0 or eb.size == 0:
        raise CompareError("both runs need successful requests to compare")
    if (ea <= 0).any():
        raise CompareError("run A has a non-positive E2EL: a percentage error against it is undefined")
    common = sorted(k for k in set(ta) & set(tb) if len(ta[k]) >= min_per_turn and len(tb[k]) >= min_per_turn)
    if not common:
        raise CompareError(f"no turn index reached by both runs with at least {min_per_turn} requests each")
    per_turn = {k: abs(float(np.mean(tb[k])) / float(np.mean(ta[k])) - 1.0) for k in common}
    qs = np.arange(5, 100, 5)
    qa, qb = np.percentile(ea, qs), np.percentile(eb, qs)
    paired: float | None = None
    ka = {(r.session, r.turn): r.e2el for r in a if r.ok and r.e2el is not None}
    kb = {(r.session, r.turn): r.e2el for r in b if r.ok and r.e2el is not None}
    if ka.keys() == kb.keys():
        paired = float(np.mean([abs(kb[k] / ka[k] - 1.0) for k in ka]))
    return {
        "per_turn_mape": float(np.mean(list(per_turn.values()))),
        "quantile_mape": float(np.mean(np.abs(qb - qa) / qa)),
        "paired_mape": paired,
        "turns_compared": common,
        "per_turn_error": {str(k): v for k, v in per_turn.items()},
        "mean_e2el_a_s": float(ea.mean()),
        "mean_e2el_b_s": float(eb.mean()),
        "requests_a": int(ea.size),
        "requests_b": int(eb.size),
    }


def mape_spread(values: Sequence[float]) -> dict[str, float]:
    """Mean, min and max of repeated MAPEs (NaN-free input expected)."""
    if not values or any(math.isnan(v) for v in values):
        raise CompareError("no MAPE values to summarise")
    return {"mean": float(np.mean(values)), "min": float(min(values)), "max": float(max(values)), "n": len(values)}
