"""CSV aggregation (skill use): group-by totals over a sales table (knob: rows)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_REGIONS = ("north", "south", "east", "west", "central")


class Config(msgspec.Struct, frozen=True):
    rows: int


@register
class CsvAggregate(Pattern):
    id = "csv-aggregate"
    dimension = "skill-use"
    domains = frozenset({"csv-json-data"})
    summary = "group-by totals over a CSV table"
    goal = "total a table by group"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"rows": (10, 40, 160, 640)}
    primary = "rows"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        totals = dict.fromkeys(_REGIONS, 0)
        lines = ["id,region,amount"]
        for i in range(cfg.rows):
            r, a = rng.choice(_REGIONS), rng.randrange(1, 1000)
            totals[r] += a
            lines.append(f"{i},{r},{a}")
        files = {f"{ns}/sales.csv": ("\n".join(lines) + "\n").encode()}
        sol = (
            f"import csv\nt = dict.fromkeys({list(_REGIONS)!r}, 0)\n"
            f"for row in csv.DictReader(open({ns + '/sales.csv'!r})): t[row['region']] += int(row['amount'])\n"
        ) + write_answer_py(cid, "t")
        return Material(
            files=files,
            instruction=(
                f"Total the `amount` of `{ns}/sales.csv` per region ({', '.join(_REGIONS)}) and write the "
                f"totals as a JSON object region -> integer to `answers/{cid}.json`."
            ),
            facts=totals,
            rubric=answer_items(cid, totals),
            solution=sol,
            given=["regions"],
            infer=["per-region totals"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(files[f"{ns}/sales.csv"].count(b"\n") - 1)
