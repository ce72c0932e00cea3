"""One load run from its description to its result document: what ``opengyre bench run`` and the gRPC
``BenchService.Run`` both do (one piece of code, so both record the same things)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ._compare import FORMS, workload_record
from ._load import LoadConfig, RunResult, run_load
from ._metrics import Slo, cross_check_tokens, summarise
from ._profiles import PAPER_PROFILES, Profile, ProfileError, fit_profile
from ._sweep import SweepPoint, SweepResult, sweep
from ._traces import read_trace
from ._workload import SessionPlan, TokenFill, replay_sessions, shadow_sessions, synthesise_sessions

__all__ = ["RunSpec", "execute_run", "plan_run", "profile_from", "sweep_profile"]

DEFAULT_SESSIONS = 16  # a built-in profile's sessions when none are asked for
SWEEP_MAX_REPEATS = 8  # runs per sweep point at most, when a step's test needs more (``opengyre bench sweep``)


@dataclass(frozen=True)
class RunSpec:
    """A run: a workload in one form, against one server, under one load shape.

    The workload is a ``trace`` (parsed JSON in ``trace_format``) in any form — ``replay`` its messages exactly,
    ``shadow`` its lengths with random tokens, ``synthetic`` sessions drawn from the profile fitted to it — or a
    ``profile`` (synthetic only). ``sessions``: how many to synthesise (default: the trace's count, so both forms
    do equal work; a profile's default is 16); replay and shadow send the trace's sessions.
    """

    url: str
    model: str
    form: str = "synthetic"
    profile: Profile | None = None
    trace: Any = None
    trace_format: str = "sharegpt"
    trace_name: str = "trace"
    sessions: int | None = None
    concurrency: int = 4
    rate: float | None = None
    workers: int = 1
    seed: int = 0
    slo: Slo | None = None

    @property
    def label(self) -> str:
        if self.trace is not None:
            return f"{self.form}:{self.trace_name}"
        return self.profile.name if self.profile else "?"


def plan_run(spec: RunSpec, tok: Any) -> tuple[list[SessionPlan], dict[str, Any]]:
    """The sessions the run sends and the workload record for its result (``ProfileError`` when impossible)."""
    if spec.form not in FORMS:
        raise ProfileError(f"form must be one of {', '.join(FORMS)}, got {spec.form!r}")
    if (spec.trace is None) == (spec.profile is None):
        raise ProfileError("give a trace or a profile (one of them)")
    if spec.sessions is not None and spec.sessions <= 0:
        raise ProfileError(f"the number of sessions must be positive, got {spec.sessions}")
    fill = TokenFill.for_tokenizer(tok)
    if spec.profile is not None:
        if spec.form != "synthetic":
            raise ProfileError(f"a profile has only the synthetic form; {spec.form} needs a trace")
        prof_doc = spec.profile.to_dict()
        plans = synthesise_sessions(spec.profile, spec.sessions or DEFAULT_SESSIONS, fill, seed=spec.seed)
        return plans, workload_record("synthetic", profile=prof_doc)
    sessions = read_trace(spec.trace, spec.trace_format, tok)
    fitted = fit_profile(spec.trace_name, sessions, f"{spec.trace_format} trace {spec.trace_name}")
    if spec.form != "synthetic" and spec.sessions is not None and spec.sessions != len(sessions):
        raise ProfileError(f"{spec.form} sends the trace's {len(sessions)} sessions; --sessions is for synthetic")
    plans_of = {
        "replay": lambda: replay_sessions(sessions),
        "shadow": lambda: shadow_sessions(sessions, fill, seed=spec.seed),
        "synthetic": lambda: synthesise_sessions(fitted, spec.sessions or len(sessions), fill, seed=spec.seed),
    }
    record = workload_record(spec.form, trace=spec.trace, trace_name=spec.trace_name, profile=fitted.to_dict())
    return plans_of[spec.form](), record


def _config(spec: RunSpec, n: int) -> dict[str, Any]:
    return {
        "url": spec.url,
        "model": spec.model,
        "concurrency": spec.concurrency,
        "rate": spec.rate,
        "workers": spec.workers,
        "sessions": n,
        "seed": spec.seed,
    }


async def execute_run(spec: RunSpec, tok: Any) -> tuple[RunResult, dict[str, Any]]:
    """Send the run and summarise it: ``(result, document)``; the document is what ``run.json`` holds."""
    plans, record = plan_run(spec, tok)
    cfg = LoadConfig(
        spec.url,
        spec.model,
        concurrency=spec.concurrency,
        rate=spec.rate,
        workers=spec.workers,
        seed=spec.seed,
        record_messages=True,
    )
    result = await run_load(cfg, plans)
    summary = summarise(result, spec.slo)
    summary["tokenizer_check"] = cross_check_tokens(result.requests, tok)
    doc = {
        "profile": record["profile"],
        "workload": record,
        "config": _config(spec, len(plans)),
        "summary": summary,
    }
    return result, doc


def profile_from(
    spec: str, length_scale: float = 1.0, turn_scale: float = 1.0, tool_latency: float | None = None
) -> Profile:
    """A built-in profile by name, or a profile JSON document, scaled by the given factors, with a stated
    constant tool latency when one is given (``Profile.with_tool_latency``)."""
    if spec in PAPER_PROFILES:
        prof = PAPER_PROFILES[spec]
    else:
        try:
            doc = json.loads(spec)
        except ValueError:
            raise ProfileError(
                f"profile {spec[:60]!r} is neither a built-in ({', '.join(PAPER_PROFILES)}) nor a JSON document"
            ) from None
        prof = Profile.from_dict(doc)
    return prof.with_tool_latency(tool_latency).scaled(length_scale, turn_scale)


async def sweep_profile(
    url: str,
    model: str,
    profile: Profile,
    concurrencies: Sequence[int],
    tok: Any,
    *,
    sessions_per_slot: int = 3,
    repeats: int = 2,
    max_repeats: int | None = None,
    tolerance: float = 0.05,
    beyond: int = 2,
    workers: int = 1,
    progress: Callable[[SweepPoint], None] | None = None,
) -> SweepResult:
    """The closed-loop sweep of a profile over increasing concurrency (fresh sessions for every point and repeat)."""
    if sessions_per_slot <= 0:
        raise ProfileError(f"sessions per slot must be positive, got {sessions_per_slot}")
    fill = TokenFill.for_tokenizer(tok)

    async def run_at(c: int, rep: int) -> tuple[RunResult, dict[str, Any]]:
        plans = synthesise_sessions(profile, max(c * sessions_per_slot, 4), fill, seed=1000 * rep + c)
        r = await run_load(LoadConfig(url, model, concurrency=c, workers=min(workers, c), seed=rep), plans)
        return r, summarise(r)

    return await sweep(
        run_at,
        concurrencies,
        repeats=repeats,
        max_repeats=max_repeats,
        tolerance=tolerance,
        beyond=beyond,
        progress=progress,
    )
