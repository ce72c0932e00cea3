"""Ordering dependencies (planning): jobs with prerequisites into the canonical execution order (knob: jobs)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    jobs: int


def _order(deps: Mapping[str, list[str]]) -> list[str]:
    indeg = {j: len(d) for j, d in deps.items()}
    ready = [j for j, n in indeg.items() if n == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        j = heapq.heappop(ready)
        out.append(j)
        for k, d in deps.items():
            if j in d:
                indeg[k] -= 1
                if indeg[k] == 0:
                    heapq.heappush(ready, k)
    return out


@register
class OrderingDependencies(Pattern):
    id = "ordering-dependencies"
    dimension = "planning"
    domains = frozenset({"shell-scripting", "local-service", "git"})
    summary = "jobs and prerequisites scheduled in the one canonical topological order"
    goal = "order jobs by their prerequisites"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"jobs": (3, 6, 10, 15)}
    primary = "jobs"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        names = [f"job-{chr(97 + i)}{rng.randrange(10)}" for i in range(cfg.jobs)]
        rng.shuffle(names)
        deps = {n: sorted(rng.sample(names[:i], min(i, rng.randrange(3)))) for i, n in enumerate(names)}
        files = {f"{ns}/jobs/{n}.txt": ("requires: " + " ".join(d) + "\n").encode() for n, d in deps.items()}
        order = _order(deps)
        sol = (
            "import heapq\n"
            f"d = {ns + '/jobs'!r}\n"
            "deps = {fn[:-4]: open(os.path.join(d, fn)).read().split(':', 1)[1].split() for fn in os.listdir(d)}\n"
            "indeg = {j: len(x) for j, x in deps.items()}\n"
            "ready = sorted(j for j, n in indeg.items() if n == 0)\nout = []\n"
            "while ready:\n    j = heapq.heappop(ready); out.append(j)\n"
            "    for k, x in deps.items():\n        if j in x:\n            indeg[k] -= 1\n"
            "            if indeg[k] == 0: heapq.heappush(ready, k)\n"
        ) + write_answer_py(cid, "{'order': out}")
        facts = {"order": order}
        return Material(
            files=files,
            instruction=(
                f"Each file in `{ns}/jobs/` lists a job's prerequisites. Give the execution order that runs "
                "every job after its prerequisites, choosing the alphabetically smallest ready job at each "
                f'step, as `{{"order": [...]}}` in `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            infer=["the order"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/jobs/")))
