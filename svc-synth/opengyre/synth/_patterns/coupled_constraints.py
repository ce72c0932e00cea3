"""Coupled constraints: requirements each satisfiable alone share decision variables (knob: coupling density)."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, RubricItem, answer_path, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    coupled: int


_VARS = ("cpu", "mem", "disk", "net", "gpu")
_LO, _HI = 0, 7


@register
class CoupledConstraints(Pattern):
    id = "coupled-constraints"
    dimension = "planning"
    summary = "per-team requirements that share decision variables and must be solved jointly"
    goal = "settle values every team's requirements accept"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"coupled": (0, 2, 4, 6)}
    primary = "coupled"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        hidden = {v: rng.randint(_LO, _HI) for v in _VARS}
        cons: list[dict[str, Any]] = []
        for v in _VARS:  # one bound per variable: satisfiable alone
            op = rng.choice(("<=", ">="))
            cons.append({"vars": [v], "coef": [1], "op": op, "rhs": hidden[v]})
        for _ in range(cfg.coupled):
            a, b = rng.sample(_VARS, 2)
            ka, kb = rng.choice((1, 2)), rng.choice((1, -1))
            cons.append({"vars": [a, b], "coef": [ka, kb], "op": "==", "rhs": ka * hidden[a] + kb * hidden[b]})
        files: dict[str, bytes] = {}
        for i, c in enumerate(cons):
            lhs = " + ".join(f"{k}*{v}" for k, v in zip(c["coef"], c["vars"], strict=True))
            files[f"{ns}/requirements/team_{i:02d}.txt"] = f"requirement: {lhs} {c['op']} {c['rhs']}\n".encode()
        rubric = [
            RubricItem(
                id=f"{cid}.req{i:02d}",
                challenge=cid,
                weight=1.0 / len(cons),
                kind="json_constraint",
                file=answer_path(cid),
                constraint={**c, "lo": _LO, "hi": _HI},
            )
            for i, c in enumerate(cons)
        ]
        sol = (
            "import itertools, re\ncons = []\n"
            f"for fn in sorted(os.listdir({ns + '/requirements'!r})):\n"
            f"    text = open(os.path.join({ns + '/requirements'!r}, fn)).read().split(': ', 1)[1]\n"
            "    m = re.match(r'(.*) (<=|>=|==) (-?\\d+)', text.strip())\n"
            "    terms = [t.split('*') for t in m.group(1).split(' + ')]\n"
            "    cons.append(([(int(k), v) for k, v in terms], m.group(2), int(m.group(3))))\n"
            f"names = {list(_VARS)!r}\n"
            f"for vals in itertools.product(range({_LO}, {_HI + 1}), repeat=len(names)):\n"
            "    a = dict(zip(names, vals))\n"
            "    if all({'==': s == r, '<=': s <= r, '>=': s >= r}[op] for s, op, r in "
            "((sum(k * a[v] for k, v in t), op, r) for t, op, r in cons)):\n"
            "        break\n"
        ) + write_answer_py(cid, "a")
        return Material(
            files=files,
            instruction=(
                f"The teams' requirements in `{ns}/requirements/` constrain the integers {', '.join(_VARS)} "
                f"(each from {_LO} to {_HI}). Choose values meeting all of them at once and write them as a JSON "
                f"object to `answers/{cid}.json`."
            ),
            facts={"assignment": json.dumps(hidden, sort_keys=True)},
            rubric=rubric,
            solution=sol,
            given=["variable names and range"],
            discover=[f"{len(cons)} requirements, {cfg.coupled} of them coupling two variables"],
            infer=["a joint assignment"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p, b in files.items() if p.startswith(ns + "/requirements/") and b.count(b"*") > 1))
