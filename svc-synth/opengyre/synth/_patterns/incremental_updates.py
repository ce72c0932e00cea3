"""Incremental updates (long-horizon consistency): a base and ordered patches, with deletions (knob: patches)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import jdump, name
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    patches: int


@register
class IncrementalUpdates(Pattern):
    id = "incremental-updates"
    dimension = "long-horizon-consistency"
    domains = frozenset({"configuration", "csv-json-data", "git"})
    summary = "final state from a base and an ordered series of patches (null deletes)"
    goal = "apply a series of updates to a base state"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"patches": (1, 3, 6, 10)}
    primary = "patches"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        keys = sorted({name(rng, 1) for _ in range(8)})
        state: dict[str, Any] = {k: rng.randrange(100) for k in keys}
        files = {f"{ns}/base.json": jdump(state)}
        for i in range(cfg.patches):
            patch: dict[str, Any] = {}
            for k in rng.sample(keys, 3):
                patch[k] = None if rng.random() < 0.2 else rng.randrange(100)
            files[f"{ns}/patches/{i + 1:04d}.json"] = jdump(patch)
            for k, v in patch.items():
                if v is None:
                    state.pop(k, None)
                else:
                    state[k] = v
        facts = {"state": dict(sorted(state.items()))}
        sol = (
            f"s = json.load(open({ns + '/base.json'!r}))\nd = {ns + '/patches'!r}\n"
            "for fn in sorted(os.listdir(d)):\n"
            "    for k, v in json.load(open(os.path.join(d, fn))).items():\n"
            "        if v is None: s.pop(k, None)\n        else: s[k] = v\n"
        ) + write_answer_py(cid, "{'state': s}")
        return Material(
            files=files,
            instruction=(
                f"Apply the patches in `{ns}/patches/` in order to `{ns}/base.json` (a null value deletes the "
                f'key) and write `{{"state": {{...}}}}` to `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/patches/")))
