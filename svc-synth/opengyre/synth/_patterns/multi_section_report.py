"""Multi-section report (long-horizon consistency): each section computed from its own source (knob: sections)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_OPS = ("max", "min", "sum", "count_over_50")


class Config(msgspec.Struct, frozen=True):
    sections: int


@register
class MultiSectionReport(Pattern):
    id = "multi-section-report"
    dimension = "long-horizon-consistency"
    domains = frozenset({"csv-json-data", "text-processing", "logs"})
    summary = "a report whose sections each follow their own rule over their own file"
    goal = "write a report of several sections"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"sections": (2, 3, 5, 7)}
    primary = "sections"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        files: dict[str, bytes] = {}
        facts: dict[str, int] = {}
        spec: list[str] = []
        for s in range(cfg.sections):
            nums = [rng.randrange(100) for _ in range(rng.randrange(5, 15))]
            op = _OPS[(s + rng.randrange(4)) % 4]
            files[f"{ns}/inputs/section_{s}.txt"] = ("\n".join(map(str, nums)) + "\n").encode()
            spec.append(f"section_{s}: {op}")
            rules: dict[str, int] = {"max": max(nums), "min": min(nums), "sum": sum(nums)}
            facts[f"section_{s}"] = rules[op] if op != "count_over_50" else sum(1 for n in nums if n > 50)
        files[f"{ns}/REPORT_SPEC.txt"] = ("\n".join(spec) + "\n").encode()
        sol = (
            f"r = {{}}\nfor line in open({ns + '/REPORT_SPEC.txt'!r}):\n    sec, op = line.strip().split(': ')\n"
            f"    n = [int(x) for x in open(os.path.join({ns + '/inputs'!r}, sec + '.txt')).read().split()]\n"
            "    r[sec] = ({'max': max, 'min': min, 'sum': sum}[op](n) if op != 'count_over_50'\n"
            "              else sum(1 for x in n if x > 50))\n"
        ) + write_answer_py(cid, "r")
        return Material(
            files=files,
            instruction=(
                f"Build the report `{ns}/REPORT_SPEC.txt` describes (one rule per section over "
                f"`{ns}/inputs/<section>.txt`) and write section -> number as JSON to `answers/{cid}.json`."
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/inputs/")))
