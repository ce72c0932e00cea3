"""JSON query (skill use): one service's setting nested d levels deep in an inventory (knob: depth)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import jdump, name
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    depth: int


@register
class JsonQuery(Pattern):
    id = "json-query"
    dimension = "skill-use"
    domains = frozenset({"csv-json-data", "configuration"})
    summary = "a setting of one named service nested deep in a JSON inventory among siblings"
    goal = "read one service's setting out of an inventory"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"depth": (1, 2, 3, 5)}
    primary = "depth"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        target = "svc-" + name(rng)
        value = rng.randrange(100, 60000)

        def node(level: int, here: bool) -> dict[str, Any]:
            if level == cfg.depth:
                svcs = [{"name": "svc-" + name(rng), "timeout_ms": rng.randrange(100, 60000)} for _ in range(2)]
                if here:
                    svcs.insert(rng.randrange(3), {"name": target, "timeout_ms": value})
                return {"services": svcs}
            pick = rng.randrange(2)
            return {"groups": {f"g{level}{k}": node(level + 1, here and k == pick) for k in range(2)}}

        files = {f"{ns}/inventory.json": jdump(node(0, True))}
        sol = (
            "def _find(o):\n"
            "    if isinstance(o, dict):\n"
            f"        if o.get('name') == {target!r}: return o['timeout_ms']\n"
            "        o = list(o.values())\n"
            "    if isinstance(o, list):\n"
            "        for x in o:\n"
            "            r = _find(x)\n"
            "            if r is not None: return r\n"
            "    return None\n"
            f"v = _find(json.load(open({ns + '/inventory.json'!r})))\n"
        ) + write_answer_py(cid, "{'timeout_ms': v}")
        return Material(
            files=files,
            instruction=(
                f"Find the `timeout_ms` of service `{target}` in `{ns}/inventory.json` and write "
                f'`{{"timeout_ms": <integer>}}` to `answers/{cid}.json`.'
            ),
            facts={"timeout_ms": value},
            rubric=answer_items(cid, {"timeout_ms": value}),
            solution=sol,
            given=["service name"],
            discover=[f"the service {cfg.depth} levels deep"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        def depth(o: Any) -> int:
            if isinstance(o, dict):
                return (1 if "groups" in o else 0) + max((depth(v) for v in o.values()), default=0)
            if isinstance(o, list):
                return max((depth(v) for v in o), default=0)
            return 0

        return float(depth(json.loads(files[f"{ns}/inventory.json"])))
