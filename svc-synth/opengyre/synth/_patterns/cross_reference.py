"""Cross-reference integrity (long-horizon consistency): orders that reference unknown SKUs (knob: orders)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import jdump
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    orders: int


@register
class CrossReference(Pattern):
    id = "cross-reference"
    dimension = "long-horizon-consistency"
    domains = frozenset({"csv-json-data"})
    summary = "every order checked against the inventory for dangling SKU references"
    goal = "check orders against the inventory"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"orders": (5, 15, 40, 100)}
    primary = "orders"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        skus = sorted({f"SKU{rng.randrange(1000, 9999)}" for _ in range(20)})
        files = {f"{ns}/inventory.csv": ("sku,qty\n" + "".join(f"{s},{rng.randrange(50)}\n" for s in skus)).encode()}
        bad = []
        for i in range(cfg.orders):
            lines = rng.sample(skus, 2)
            if i == 0 or rng.random() < 0.2:
                lines.append(f"SKU{rng.randrange(10000, 19999)}")
                bad.append(f"o{i:04d}")
            files[f"{ns}/orders/o{i:04d}.json"] = jdump({"id": f"o{i:04d}", "lines": [{"sku": s} for s in lines]})
        facts = {"dangling": bad}
        sol = (
            f"import csv\nknown = {{r['sku'] for r in csv.DictReader(open({ns + '/inventory.csv'!r}))}}\n"
            f"d = {ns + '/orders'!r}\nbad = []\n"
            "for fn in sorted(os.listdir(d)):\n    o = json.load(open(os.path.join(d, fn)))\n"
            "    if any(l['sku'] not in known for l in o['lines']): bad.append(o['id'])\n"
        ) + write_answer_py(cid, "{'dangling': sorted(bad)}")
        return Material(
            files=files,
            instruction=(
                f"Which orders in `{ns}/orders/` reference a SKU missing from `{ns}/inventory.csv`? Write "
                f'their ids sorted as `{{"dangling": [...]}}` to `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/orders/")))
