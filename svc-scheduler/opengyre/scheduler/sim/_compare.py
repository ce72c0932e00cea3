"""Comparing policies honestly: the async baseline at its best fixed split, and ratios only between runs that
trained the same groups (equal work, equal composition)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..policies import make_policy
from ._config import SimConfig
from ._engine import simulate
from ._result import SimResult

__all__ = ["SPLIT_POLICIES", "PolicyRun", "best_split", "comparable", "parse_spec", "run_spec", "split_candidates"]

# Policies with a fixed training pool: without ``train_cells`` they run at their best split.
SPLIT_POLICIES = frozenset({"async", "async-streaming"})


@dataclass
class PolicyRun:
    spec: str
    result: SimResult
    split: int | None = None  # training cells, for a fixed-split policy
    searched: list[int] = field(default_factory=list)  # the splits tried, when the split was searched
    wall_s: float = 0.0

    @property
    def label(self) -> str:
        if self.split is None:
            return self.spec
        how = "best of " + _ranges(self.searched) if self.searched else "given"
        return f"{self.result.policy} (split {self.split}: {how})"


def parse_spec(spec: str) -> tuple[str, dict[str, int]]:
    """``async:train_cells=3`` -> ("async", {"train_cells": 3})."""
    name, _, rest = spec.partition(":")
    params: dict[str, int] = {}
    for kv in filter(None, rest.split(",")):
        k, sep, v = kv.partition("=")
        if not sep:
            raise ValueError(f"policy parameter {kv!r} in {spec!r} is not name=value")
        try:
            params[k.strip()] = int(v)
        except ValueError:
            raise ValueError(f"policy parameter {k.strip()} in {spec!r} must be an integer, not {v!r}") from None
    return name.strip(), params


def _timed(cfg: SimConfig, name: str, params: dict[str, int]) -> tuple[SimResult, float]:
    t0 = time.perf_counter()
    r = simulate(cfg, make_policy(name, **params))
    return r, time.perf_counter() - t0


def split_candidates(cells: int) -> list[int]:
    """Every split for a small cluster; a spread of 12 for a large one (``best_split`` refines around the best)."""
    if cells - 1 <= 16:
        return list(range(1, cells))
    return sorted({round(1 + i * (cells - 2) / 11) for i in range(12)})


def best_split(cfg: SimConfig, name: str, params: dict[str, int] | None = None) -> tuple[SimResult, int, list[int]]:
    """The fixed-split policy at its fastest number of training cells (the split one would tune in practice).

    Small clusters try every split; large ones a spread of 12, then every split between the best one's
    neighbours, narrowing (the time is not assumed unimodal between the points tried)."""
    params = dict(params or {})
    tried: dict[int, SimResult] = {}

    def at(k: int) -> SimResult:
        if k not in tried:
            tried[k] = simulate(cfg, make_policy(name, **params, train_cells=k))
        return tried[k]

    grid = split_candidates(cfg.cluster.cells)
    if not grid:
        raise ValueError(f"{name}: a fixed split needs at least 2 cells (one trains, one rolls out)")
    for k in grid:
        at(k)
    while True:
        best = min(tried, key=lambda k: (tried[k].hours, k))
        done = sorted(tried)
        i = done.index(best)
        lo = done[i - 1] if i > 0 else best
        hi = done[i + 1] if i + 1 < len(done) else best
        gaps = [k for k in range(lo + 1, hi) if k not in tried]
        if not gaps:
            return tried[best], best, sorted(tried)
        span = max(1, (hi - lo) // 8)
        for k in range(lo + span, hi, span):
            at(k)


def run_spec(cfg: SimConfig, spec: str) -> PolicyRun:
    name, params = parse_spec(spec)
    t0 = time.perf_counter()
    if name in SPLIT_POLICIES and "train_cells" not in params:
        make_policy(name, **params)  # unknown names and parameters fail before the search
        r, k, searched = best_split(cfg, name, params)
        return PolicyRun(spec, r, k, searched, time.perf_counter() - t0)
    r, wall = _timed(cfg, name, params)
    return PolicyRun(spec, r, params.get("train_cells") if name in SPLIT_POLICIES else None, [], wall)


def comparable(a: SimResult, b: SimResult) -> bool:
    """Equal trained work and composition: the same groups trained, nothing finished left untrained."""
    return (
        a.trained.digest == b.trained.digest
        and not a.trained.leaves_work_untrained
        and not (b.trained.leaves_work_untrained)
    )


def _ranges(ks: Sequence[int]) -> str:
    if not ks:
        return ""
    if list(ks) == list(range(ks[0], ks[-1] + 1)):
        return f"{ks[0]}-{ks[-1]}" if len(ks) > 1 else str(ks[0])
    return f"{len(ks)} tried in {ks[0]}-{ks[-1]}"


def summary(run: PolicyRun) -> dict[str, Any]:
    out = run.result.summary()
    out["label"] = run.label
    out["split"] = run.split
    return out
