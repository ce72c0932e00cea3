"""Linked records (environment understanding): follow references record to record (knob: hops)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import jdump, token
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    hops: int


@register
class LinkedRecords(Pattern):
    id = "linked-records"
    dimension = "environment-understanding"
    domains = frozenset({"csv-json-data"})
    summary = "the owner's contact reached through a chain of related records"
    goal = "follow related records to a contact"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"hops": (1, 2, 4, 6)}
    primary = "hops"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        ids = [f"r{rng.randrange(10000, 99999)}" for _ in range(cfg.hops + 1 + 4)]
        ids = list(dict.fromkeys(ids))
        while len(ids) < cfg.hops + 5:
            ids.append(f"r{len(ids)}x")
        chain, decoys = ids[: cfg.hops + 1], ids[cfg.hops + 1 :]
        contact = f"{token(rng, 6).lower()}@example.test"
        files = {}
        for i, r in enumerate(chain):
            rec: dict[str, Any] = {"id": r}
            if i + 1 < len(chain):
                rec["owned_by"] = chain[i + 1]
            else:
                rec["contact"] = contact
            files[f"{ns}/records/{r}.json"] = jdump(rec)
        for r in decoys:
            files[f"{ns}/records/{r}.json"] = jdump({"id": r, "contact": f"{token(rng, 6).lower()}@example.test"})
        sol = (
            f"r = json.load(open(os.path.join({ns + '/records'!r}, {chain[0] + '.json'!r})))\n"
            "while 'contact' not in r:\n"
            f"    r = json.load(open(os.path.join({ns + '/records'!r}, r['owned_by'] + '.json')))\n"
        ) + write_answer_py(cid, "{'contact': r['contact']}")
        return Material(
            files=files,
            instruction=(
                f"Record `{chain[0]}` in `{ns}/records/` is owned by another record, and so on. Find the "
                f'contact of its ultimate owner and write `{{"contact": "..."}}` to `answers/{cid}.json`.'
            ),
            facts={"contact": contact},
            rubric=answer_items(cid, {"contact": contact}),
            solution=sol,
            discover=[f"{cfg.hops} ownership hops"],
            evidence=[f"{ns}/records/{r}.json" for r in chain],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        recs = {json.loads(b)["id"]: json.loads(b) for p, b in files.items() if p.startswith(f"{ns}/records/")}
        owned = {r.get("owned_by") for r in recs.values()}
        starts = [r for r in recs if r not in owned and "owned_by" in recs[r]]
        hops = 0
        r = recs[starts[0]]
        while "owned_by" in r:
            hops, r = hops + 1, recs[r["owned_by"]]
        return float(hops)
