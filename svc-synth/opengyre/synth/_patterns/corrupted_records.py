"""Corrupted records (error recovery): malformed rows to skip and count (knob: bad)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, Precondition, answer_items, register, write_answer_py

_LOADER = """import csv, sys
total = 0
for row in csv.DictReader(open(sys.argv[1])):
    total += int(row["qty"]) * int(row["price"])
print(total)
"""


class Config(msgspec.Struct, frozen=True):
    bad: int


@register
class CorruptedRecords(Pattern):
    id = "corrupted-records"
    dimension = "error-recovery"
    domains = frozenset({"csv-json-data"})
    summary = "a loader that crashes on malformed rows; the valid total and the rejects are wanted"
    goal = "load a data file that holds bad rows"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"bad": (1, 5, 15, 40)}
    primary = "bad"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        rows, total = [], 0
        for i in range(60):
            q, p = rng.randrange(1, 20), rng.randrange(1, 500)
            rows.append(f"{i},{q},{p}")
            total += q * p
        for j in range(cfg.bad):
            kind = j % 3
            rows.append([f"x{j},,{rng.randrange(9)}", f"x{j},{rng.randrange(9)},n/a", f"x{j},{rng.randrange(9)}"][kind])
        rng.shuffle(rows)
        files = {
            f"{ns}/orders.csv": ("id,qty,price\n" + "\n".join(rows) + "\n").encode(),
            f"{ns}/load.py": _LOADER.encode(),
        }
        facts = {"total": total, "rejected": cfg.bad}
        sol = (
            "import csv\nt = r = 0\n"
            f"for row in csv.DictReader(open({ns + '/orders.csv'!r})):\n"
            "    try: t += int(row['qty']) * int(row['price'])\n"
            "    except (TypeError, ValueError): r += 1\n"
        ) + write_answer_py(cid, "{'total': t, 'rejected': r}")
        argv = ["python3", f"{ns}/load.py", f"{ns}/orders.csv"]
        return Material(
            files=files,
            instruction=(
                f"`python3 {ns}/load.py {ns}/orders.csv` crashes on malformed rows (missing or non-integer "
                "qty/price). Compute the total of qty*price over the valid rows and count the malformed ones; "
                f'write `{{"total": t, "rejected": n}}` to `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
            preconditions=[Precondition(what="the loader crashes on the data", argv=argv, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        bad = 0
        for line in files[f"{ns}/orders.csv"].decode().splitlines()[1:]:
            parts = line.split(",")
            if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
                bad += 1
        return float(bad)
