"""Fingerprints of whole simulator runs: every event (less its random id), every decision with the instant and
sequence number it was taken at, the step records, the utilisation timeline and the summary, hashed.

``sim_traces.json`` holds the fingerprints of random small workloads as the simulator and the shared policy/state
code gave them before the speed work (commit 1962f25, the indexed-but-unoptimised engine); the test checks that
today's code gives the same ones (results with floats rounded to 9 significant digits). Regenerate only when a decision is *meant* to change, and say why in the commit:

    .venv/bin/python -m tests.scheduler._traces > tests/scheduler/sim_traces.json
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import sys
from dataclasses import replace
from typing import Any

import msgspec

from opengyre.scheduler import LoopConfig
from opengyre.scheduler.policies import POLICIES, make_policy
from opengyre.scheduler.sim import ClusterConfig, CostConfig, MoveCost, SimConfig, Simulator, simulate

from ._small import SMALL_WORKLOAD

CASES = 48


def case(k: int) -> tuple[str, dict[str, int], SimConfig]:
    """The ``k``-th random small workload: policy, its parameters, cluster shape, loop, costs, seed."""
    rnd = random.Random(1000 + k)
    name = sorted(POLICIES)[k % len(POLICIES)]
    cells = rnd.choice([2, 3, 4, 6, 8, 16])
    params: dict[str, int] = {}
    if name.startswith("async"):
        params["train_cells"] = rnd.randint(1, max(1, cells - 1))
    if name == "elastic-carry" and rnd.random() < 0.3:
        params["drop_stale"] = 1
    if name in ("elastic", "elastic-carry") and rnd.random() < 0.3:
        params["ready_per_cell"] = rnd.randint(1, 3)
    resident = rnd.choice([0, 0, 1, 2]) if name != "async" or cells > 2 else 0
    if name == "colocate-resident":
        resident = max(resident, 1)
    mixed = tuple(rnd.choice([4, 8, 16]) for _ in range(rnd.randint(0, 3))) if rnd.random() < 0.3 else ()
    gps = rnd.randint(2, 6)
    loop = LoopConfig(
        steps=rnd.randint(2, 5),
        groups_per_step=gps,
        group_size=4,
        max_lag=rnd.randint(0, 2),
        micro_groups=rnd.choice([1, 1, 2]),
        micro_splits=rnd.choice([1, 1, 2, 3]),
    )
    cluster = ClusterConfig(
        cells=cells, nodes_per_cell=1, gpus_per_node=8, slots_per_cell=rnd.choice([4, 8, 12]),
        resident_cells=resident, cell_gpus=mixed[: cells + resident],
    )  # fmt: skip
    move = MoveCost() if rnd.random() < 0.5 else CostConfig().move
    costs = CostConfig(micro_step_s=rnd.choice([120.0, 300.0, 900.0]), step_overhead_s=30.0, move=move)
    return name, params, SimConfig(loop, cluster, costs, SMALL_WORKLOAD, seed=rnd.randint(0, 10_000))


def _rounded(x: Any) -> Any:
    """Results with floats to 9 significant digits: sums of many durations differ in the last bits between CPUs
    and libms (the recorded fingerprints failed on another machine with identical events and decisions)."""
    if isinstance(x, float):
        return float(f"{x:.9g}")
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _rounded(dataclasses.asdict(x))
    if isinstance(x, msgspec.Struct):
        return _rounded(msgspec.to_builtins(x))
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def _h(h: Any, x: Any) -> None:
    h.update(json.dumps(x, sort_keys=True, default=repr).encode())
    h.update(b"\n")


def fingerprint(name: str, params: dict[str, int], cfg: SimConfig) -> dict[str, str]:
    """Digests of the recorded run (events and decisions) and of the event-free run's results."""
    sim = Simulator(replace(cfg, record_events=True), make_policy(name, **params))
    try:
        result = sim.run()
    except RuntimeError as exc:  # a stalled run is a result too: the same error, at the same point
        return {"error": str(exc).split(" (t = ")[0]}
    events, decisions, results = hashlib.sha256(), hashlib.sha256(), hashlib.sha256()
    for e in sim.events:
        body = msgspec.to_builtins(e)
        body.pop("event_id", None)
        _h(events, [type(e).__name__, body])
    for seq, t, d in sim.decisions:
        _h(decisions, [seq, repr(t), repr(d)])
    fast = simulate(cfg, make_policy(name, **params))
    for r in (result, fast):
        _h(results, _rounded([r.summary(), list(r.steps), r.timeline, r.refusals]))
    return {"events": events.hexdigest(), "decisions": decisions.hexdigest(), "results": results.hexdigest()}


def all_fingerprints() -> dict[str, dict[str, str]]:
    out = {}
    for k in range(CASES):
        name, params, cfg = case(k)
        out[f"{k}:{name}"] = fingerprint(name, params, cfg)
    return out


if __name__ == "__main__":
    json.dump(all_fingerprints(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
