"""Workloads: execution-duration distributions with timeouts, and their calibration to published statistics.

A parametric duration is ``min(timeout, scale * E**(1/shape) * exp(s_task * Z - s_task**2 / 2))`` with
``E ~ Exp(1)`` and ``Z ~ N(0, 1)``: a Weibull per execution (a light right tail: building a repository takes a
bounded amount of work) times a lognormal difficulty factor shared by the members of a group (a hard repository
is slow for every sample). Three parameters, fitted to published numbers: the mean execution ("rollout") time,
the mean query time (a query is a group, done when its slowest member is) and the share of queries over 4 h.
An empirical workload resamples recorded groups instead (one fitted from our own trajectory store, say).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

__all__ = [
    "Calibration",
    "DurationModel",
    "Durations",
    "EmpiricalDurations",
    "GroupDurations",
    "WorkloadStats",
    "calibrate",
    "measure",
]

HOUR = 3600.0


class Durations(Protocol):
    """What the simulator needs of a workload: draw groups of execution durations (seconds)."""

    @property
    def name(self) -> str: ...
    @property
    def timeout_s(self) -> float: ...
    @property
    def group_size(self) -> int: ...
    def sample(self, rng: np.random.Generator, groups: int) -> np.ndarray:
        """Durations in seconds, shape (groups, group_size)."""
        ...


@dataclass(frozen=True, slots=True)
class DurationModel:
    name: str
    scale_h: float
    shape: float  # Weibull shape of one execution's duration
    sigma_task: float  # log-sd of the per-group difficulty factor
    timeout_s: float
    group_size: int = 16

    def sample(self, rng: np.random.Generator, groups: int) -> np.ndarray:
        """Durations in seconds, shape (groups, group_size)."""
        return _durations(self, *_draw(rng, groups, self.group_size))

    def validate(self) -> None:
        if not (self.scale_h > 0 and self.shape > 0 and self.sigma_task >= 0 and self.timeout_s > 0):
            raise ValueError(f"workload {self.name}: scale, shape and timeout must be > 0 and sigma_task >= 0")
        if self.group_size < 1:
            raise ValueError(f"workload {self.name}: group_size must be >= 1")


@dataclass(frozen=True, slots=True)
class EmpiricalDurations:
    """Recorded groups (seconds, one row per group), resampled with replacement: the workload as it was."""

    name: str
    groups: tuple[tuple[float, ...], ...]
    timeout_s: float
    _array: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"workload {self.name}: no groups")
        sizes = {len(g) for g in self.groups}
        if len(sizes) != 1:
            raise ValueError(f"workload {self.name}: every group needs the same size, got {sorted(sizes)}")
        arr = np.asarray(self.groups, dtype=float)
        if not np.all(np.isfinite(arr)) or arr.min() <= 0:
            raise ValueError(f"workload {self.name}: durations must be finite and > 0")
        if self.timeout_s <= 0 or arr.max() > self.timeout_s:
            raise ValueError(f"workload {self.name}: a duration exceeds the timeout {self.timeout_s:g} s")
        object.__setattr__(self, "_array", arr)

    @property
    def group_size(self) -> int:
        return len(self.groups[0])

    def sample(self, rng: np.random.Generator, groups: int) -> np.ndarray:
        out: np.ndarray = self._array[rng.integers(0, len(self._array), size=groups)]
        return out


class GroupDurations:
    """The k-th dispatched group's durations, drawn lazily in fixed chunks from one seeded stream.

    Common random numbers: the k-th group lasts the same under every policy, however many groups a policy
    dispatches (there is no fixed pool to run out of).
    """

    CHUNK = 256

    def __init__(self, model: Durations, seed: int) -> None:
        self._model = model
        self._rng = np.random.default_rng(seed)
        self._chunks: list[np.ndarray] = []

    def _ensure(self, chunk: int) -> None:
        while len(self._chunks) <= chunk:
            self._chunks.append(self._model.sample(self._rng, self.CHUNK))

    def group(self, k: int) -> np.ndarray:
        c, r = divmod(k, self.CHUNK)
        self._ensure(c)
        row: np.ndarray = self._chunks[c][r]
        return row

    def groups(self, ks: Sequence[int]) -> np.ndarray:
        """Rows for group indices ``ks``, shape (len(ks), group_size)."""
        if not len(ks):
            return np.zeros((0, self._model.group_size))
        self._ensure(max(ks) // self.CHUNK)
        return np.stack([self._chunks[k // self.CHUNK][k % self.CHUNK] for k in ks])


def _draw(rng: np.random.Generator, groups: int, group_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The random numbers behind ``groups`` groups: Z (one per group, the task's difficulty), then E."""
    z = rng.standard_normal((groups, 1))
    e = rng.standard_exponential((groups, group_size))
    return z, e


def _durations(m: DurationModel, z: np.ndarray, e: np.ndarray, *, portable: bool = True) -> np.ndarray:
    """``portable``: the same bits on every machine (libm: 1.5 ms per 4,096 durations, ~36× NumPy's). The
    calibration's search evaluates hundreds of candidate models on one large draw and compares only its
    statistics: it keeps NumPy's."""
    power = 1.0 / m.shape
    arg = m.sigma_task * z - m.sigma_task**2 / 2
    if portable:
        task, spread = _libm(math.exp, arg), _libm(lambda v: math.pow(v, power), e)
    else:
        task, spread = np.exp(arg), e**power
    out: np.ndarray = np.minimum(m.scale_h * HOUR * spread * task, m.timeout_s)
    return out


def _libm(fn: Callable[[float], float], x: np.ndarray) -> np.ndarray:
    """``fn`` of each element through the C library (Python's math). NumPy's float64 ``exp`` and ``power`` are
    dispatched by CPU (AVX-512 machines run NumPy's own vectorised versions, a few ULP from libm's), and the
    simulator's answers must not depend on the machine: the recorded fingerprints (tests/scheduler/sim_traces.json)
    differed in 6 of 50 cases between two machines with unchanged code."""
    return np.fromiter((fn(v) for v in x.flat), dtype=np.float64, count=x.size).reshape(x.shape)


@dataclass(frozen=True, slots=True)
class WorkloadStats:
    mean_execution_h: float
    mean_query_h: float
    share_queries_over: float  # share of queries longer than ``over_h``
    over_h: float
    share_timed_out: float
    # The same share among queries none of whose members hit the timeout ("queries with complete durations").
    share_complete_queries_over: float = 0.0
    share_queries_timed_out: float = 0.0  # queries with at least one member at the timeout


def stats_of(d: np.ndarray, timeout_s: float, over_h: float = 4.0) -> WorkloadStats:
    """Statistics of durations ``d`` (seconds, shape (groups, group_size))."""
    q = d.max(axis=1)
    hit = (d >= timeout_s).any(axis=1)
    complete = q[~hit]
    return WorkloadStats(
        mean_execution_h=float(d.mean() / HOUR),
        mean_query_h=float(q.mean() / HOUR),
        share_queries_over=float((q > over_h * HOUR).mean()),
        over_h=over_h,
        share_timed_out=float((d >= timeout_s).mean()),
        share_complete_queries_over=float((complete > over_h * HOUR).mean()) if len(complete) else 0.0,
        share_queries_timed_out=float(hit.mean()),
    )


def measure(model: Durations, *, groups: int = 40_000, seed: int = 7, over_h: float = 4.0) -> WorkloadStats:
    return stats_of(model.sample(np.random.default_rng(seed), groups), model.timeout_s, over_h)


@dataclass(frozen=True, slots=True)
class Calibration:
    target: WorkloadStats
    fitted: WorkloadStats
    model: DurationModel


_PARAMS = ("scale_h", "shape", "sigma_task")


def calibrate(
    name: str,
    *,
    mean_execution_h: float | None = None,
    mean_query_h: float | None = None,
    share_queries_over: float | None = None,
    share_complete_queries_over: float | None = None,
    over_h: float = 4.0,
    timeout_s: float = 6 * HOUR,
    group_size: int = 16,
    groups: int = 20_000,
    seed: int = 7,
    fixed: dict[str, float] | None = None,
    start: tuple[float, float, float] | None = None,
) -> Calibration:
    """Fit the free parameters of (scale, shape, s_task) by a deterministic coordinate search on common random
    numbers. Targets left out are not fitted; ``fixed`` holds parameters that are not searched (a single
    published statistic fits one parameter, say the scale with the shape and spread of a related workload).
    ``share_complete_queries_over`` counts only queries none of whose members reached the timeout."""
    fixed = dict(fixed or {})
    unknown = set(fixed) - set(_PARAMS)
    if unknown:
        raise ValueError(f"unknown fixed parameters {sorted(unknown)}; known: {', '.join(_PARAMS)}")
    given = {
        "mean_execution_h": mean_execution_h,
        "mean_query_h": mean_query_h,
        "share_queries_over": share_queries_over,
        "share_complete_queries_over": share_complete_queries_over,
    }
    targets: dict[str, float] = {k: v for k, v in given.items() if v is not None}
    free = [i for i, p in enumerate(_PARAMS) if p not in fixed]
    if not targets:
        raise ValueError("calibrate needs at least one published statistic")
    if len(targets) < len(free):
        raise ValueError(
            f"{len(targets)} statistic(s) cannot identify {len(free)} free parameters; fix some of {_PARAMS}"
        )
    z, e = _draw(np.random.default_rng(seed), groups, group_size)

    def model(p: list[float]) -> DurationModel:
        return DurationModel(name, p[0], p[1], p[2], timeout_s, group_size)

    def loss(p: list[float]) -> float:
        if p[0] <= 0 or p[1] < 0.5 or p[2] < 0:
            return float("inf")
        s = stats_of(_durations(model(p), z, e, portable=False), timeout_s, over_h)
        out = 0.0
        for k, want in targets.items():
            got = getattr(s, k)
            out += ((got - want) / (max(want, 1e-3) if k.startswith("share") else want)) ** 2
        return out

    p = list(start) if start else [(mean_execution_h if mean_execution_h else over_h / 2) * 1.1, 3.0, 0.1]
    for i, k in enumerate(_PARAMS):
        if k in fixed:
            p[i] = fixed[k]
    best = loss(p)
    step = [0.2, 0.5, 0.1]
    while free and max(step[i] for i in free) > 1e-4:
        improved = False
        for i in free:
            for sign in (1.0, -1.0):
                q = list(p)
                q[i] += sign * step[i]
                v = loss(q)
                if v < best:
                    best, p, improved = v, q, True
        if not improved:
            step = [s / 2 for s in step]
    target = WorkloadStats(
        mean_execution_h or 0.0, mean_query_h or 0.0, share_queries_over or 0.0, over_h, 0.0,
        share_complete_queries_over or 0.0,
    )  # fmt: skip
    return Calibration(target, stats_of(_durations(model(p), z, e), timeout_s, over_h), model(p))
