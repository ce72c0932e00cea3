"""Resource budget (planning): the best value of a subset of items within a budget (knob: items)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    items: int


@register
class ResourceBudget(Pattern):
    id = "resource-budget"
    dimension = "planning"
    summary = "the most valuable set of upgrades that fits a budget (greedy is not enough)"
    goal = "choose upgrades within a budget"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"items": (4, 8, 12, 16)}
    primary = "items"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        items = [(f"{name(rng, 1)}-{i}", rng.randrange(5, 40), rng.randrange(5, 60)) for i in range(cfg.items)]
        budget = sum(c for _, c, _ in items) // 2
        costs = [c for _, c, _ in items]
        vals = [v for _, _, v in items]
        dp = [0] * (budget + 1)  # 0/1 knapsack: exact optimum
        for c, v in zip(costs, vals, strict=True):
            for b in range(budget, c - 1, -1):
                dp[b] = max(dp[b], dp[b - c] + v)
        best = dp[budget]
        files = {
            f"{ns}/upgrades.csv": ("name,cost,value\n" + "".join(f"{n},{c},{v}\n" for n, c, v in items)).encode(),
            f"{ns}/BUDGET.txt": f"{budget}\n".encode(),
        }
        sol = (
            f"import csv\nrows = list(csv.DictReader(open({ns + '/upgrades.csv'!r})))\n"
            f"B = int(open({ns + '/BUDGET.txt'!r}).read())\ndp = [0] * (B + 1)\n"
            "for r in rows:\n    c, v = int(r['cost']), int(r['value'])\n"
            "    for b in range(B, c - 1, -1): dp[b] = max(dp[b], dp[b - c] + v)\n"
        ) + write_answer_py(cid, "{'best_value': dp[B]}")
        return Material(
            files=files,
            instruction=(
                f"Pick upgrades from `{ns}/upgrades.csv` (each at most once) whose total cost stays within "
                f"`{ns}/BUDGET.txt`, maximising the total value; write "
                f'`{{"best_value": <integer>}}` to `answers/{cid}.json`.'
            ),
            facts={"best_value": best},
            rubric=answer_items(cid, {"best_value": best}),
            solution=sol,
            infer=["the optimal subset's value"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(files[f"{ns}/upgrades.csv"].count(b"\n") - 1)
