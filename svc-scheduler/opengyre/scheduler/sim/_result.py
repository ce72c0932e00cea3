"""What a simulation reports: hours for N steps, GPU utilisation over time, staleness, and the ideal bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._state import SchedulerState
from ._config import SimConfig

__all__ = ["IdealBound", "Segment", "SimResult", "StepRecord", "ideal_bound"]

HOUR = 3600.0
_SHARES = ("rollout_busy", "rollout_idle", "training_busy", "training_idle", "other")  # Segment's GPU fields


@dataclass(frozen=True, slots=True)
class Segment:
    """GPUs by activity over ``[t0, t1)``, constant in between."""

    t0: float
    t1: float
    rollout_busy: float
    rollout_idle: float
    training_busy: float
    training_idle: float
    other: float  # switching, draining, idle cells


@dataclass(frozen=True, slots=True)
class StepRecord:
    step: int
    at_s: float
    staleness_mean: float
    staleness_max: int


@dataclass(frozen=True, slots=True)
class IdealBound:
    """The physical limit: no schedule finishes before all GPU-work is spread over all GPUs, nor before the
    longest chain of dependent work (slowest execution of a batch, then its last micro-step) has run."""

    work_h: float  # total GPU-work / total GPUs
    chain_h: float  # longest dependency chain under the loop's staleness bound
    rollout_gpu_h: float
    training_gpu_h: float

    @property
    def hours(self) -> float:
        return max(self.work_h, self.chain_h)


def ideal_bound(cfg: SimConfig, durations: np.ndarray, *, batch_chain: bool = True) -> IdealBound:
    cl, loop, costs = cfg.cluster, cfg.loop, cfg.costs
    gpus_per_slot = cl.total_gpus / cl.total_slots
    rollout = float(durations.sum()) * gpus_per_slot
    training = loop.steps * loop.microsteps_per_step / loop.micro_splits * costs.micro_step_s * costs.reference_gpus
    work = (rollout + training) / cl.total_gpus
    # Chain: step b cannot finish before its slowest execution (dispatched when step b-1-phi finished) and
    # its last micro-step on the fastest cell, nor before step b-1; the optimizer step follows each.
    fastest = max(cl.gpus_of(i) for i in range(cl.cells))
    last_micro = costs.micro_step_s * costs.reference_gpus / fastest / loop.micro_splits
    finish = [0.0] * (loop.steps + 1)
    for b in range(1, loop.steps + 1):
        start = finish[b - 1 - loop.max_lag] if b - 1 - loop.max_lag >= 1 else 0.0
        # A policy that packs whichever groups complete first (carry-over) is not bound to its batch's slowest.
        ready = start + float(durations[b - 1].max()) if batch_chain else 0.0
        finish[b] = max(ready, finish[b - 1]) + last_micro + costs.step_overhead_s
    return IdealBound(work / HOUR, finish[-1] / HOUR, rollout / HOUR, training / HOUR)


@dataclass
class SimResult:
    policy: str
    hours: float
    steps: list[StepRecord]
    staleness_mean: float
    staleness_max: int
    utilisation: float  # busy GPU-time (rollout slots held + micro-steps running) / (GPUs x time)
    bound: IdealBound
    timeline: dict[str, list[float]]  # binned GPU shares over time, for the plot
    refusals: list[str]
    reroutes: int
    switches: int
    events: int
    completed: bool  # every step of the loop was trained (a policy can stall: the simulator then stops)
    microsteps_by_cell: dict[str, int] = field(default_factory=dict)
    totals: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        policy: str,
        config: SimConfig,
        state: SchedulerState,
        steps: list[StepRecord],
        segments: list[Segment],
        bound: IdealBound,
        refusals: list[str],
        reroutes: int,
        switches: int,
        events: int,
        microsteps_by_cell: dict[str, int],
    ) -> SimResult:
        end = steps[-1].at_s if steps else 0.0
        gpus = config.cluster.total_gpus
        totals = {k: sum((s.t1 - s.t0) * getattr(s, k) for s in segments) / HOUR for k in _SHARES}
        busy = totals["rollout_busy"] + totals["training_busy"]
        return cls(
            policy=policy,
            hours=end / HOUR,
            steps=steps,
            staleness_mean=state.staleness_mean(),
            staleness_max=state.staleness_max(),
            utilisation=busy / (gpus * end / HOUR) if end else 0.0,
            bound=bound,
            timeline=_bins(segments, end, config.timeline_bins, gpus),
            refusals=refusals,
            reroutes=reroutes,
            switches=switches,
            events=events,
            completed=len(steps) == config.loop.steps,
            microsteps_by_cell=dict(microsteps_by_cell),
            totals=totals,
        )

    def summary(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "hours": round(self.hours, 3),
            "utilisation": round(self.utilisation, 4),
            "staleness_mean": round(self.staleness_mean, 3),
            "staleness_max": self.staleness_max,
            "ideal_h": round(self.bound.hours, 3),
            "vs_ideal": round(self.hours / self.bound.hours, 3) if self.bound.hours else None,
            "switches": self.switches,
            "reroutes": self.reroutes,
            "refusals": len(self.refusals),
            "events": self.events,
            "completed": self.completed,
        }


def _bins(segments: list[Segment], end: float, n: int, gpus: int) -> dict[str, list[float]]:
    """Share of all GPUs per activity in ``n`` equal time bins (time-weighted means)."""
    keys = _SHARES
    out = {k: np.zeros(n) for k in keys}
    if end <= 0 or not segments:
        return {"t_h": [], **{k: [] for k in keys}}
    width = end / n
    for s in segments:
        t0, t1 = s.t0, min(s.t1, end)
        while t0 < t1:
            i = min(int(t0 // width), n - 1)
            edge = min(t1, (i + 1) * width)
            for k in keys:
                out[k][i] += (edge - t0) * getattr(s, k)
            if edge <= t0:
                break
            t0 = edge
    scale = 1.0 / (width * gpus)
    return {"t_h": [(i + 0.5) * width / HOUR for i in range(n)], **{k: list(out[k] * scale) for k in keys}}
