"""State dependency: each step's input is named by the previous step's output (knob: dependency depth)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    depth: int


@register
class StateDependency(Pattern):
    id = "state-dependency"
    dimension = "planning"
    summary = "later operations depend on earlier outputs: a chain of steps, each naming the next"
    goal = "run a chain of dependent steps"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"depth": (1, 3, 5, 8)}
    primary = "depth"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        keys: list[str] = []
        while len(keys) < cfg.depth + 3:
            k = name(rng, 2)
            if k not in keys:
                keys.append(k)
        chain, decoys = keys[: cfg.depth], keys[cfg.depth :]
        value = rng.randrange(1, 50)
        start = value
        files: dict[str, bytes] = {}
        for i, k in enumerate(chain):
            add, mul = rng.randrange(1, 20), rng.randrange(2, 5)
            nxt = chain[i + 1] if i + 1 < len(chain) else "END"
            files[f"{ns}/steps/{k}.txt"] = f"multiply {mul}\nadd {add}\nnext {nxt}\n".encode()
            value = (value * mul + add) % 10007
        for k in decoys:
            files[f"{ns}/steps/{k}.txt"] = (
                f"multiply {rng.randrange(2, 5)}\nadd {rng.randrange(1, 20)}\nnext END\n".encode()
            )
        sol = (
            f"v, k = {start}, {chain[0]!r}\n"
            "while k != 'END':\n"
            f"    op = dict(l.split() for l in open(os.path.join({ns + '/steps'!r}, k + '.txt')))\n"
            "    v = (v * int(op['multiply']) + int(op['add'])) % 10007; k = op['next']\n"
        ) + write_answer_py(cid, "{'result': v}")
        return Material(
            files=files,
            instruction=(
                f"Start with the value {start} and step `{chain[0]}` in `{ns}/steps/`. Each step multiplies, then "
                "adds, then names the next step (`END` stops); keep the value modulo 10007. Write "
                f'`{{"result": <integer>}}` to `answers/{cid}.json`.'
            ),
            facts={"result": value},
            rubric=answer_items(cid, {"result": value}),
            solution=sol,
            given=["start value", "first step"],
            discover=["each next step from the previous step's file"],
            infer=["the chained result"],
            derivations=[f"{cfg.depth} chained steps"],
            evidence=[f"{ns}/steps/{k}.txt" for k in chain],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        # Length of the chain: steps reachable by "next" from a step no other step names.
        nxt = {
            p.rsplit("/", 1)[1][:-4]: b.decode().split("next ")[1].strip()
            for p, b in files.items()
            if p.startswith(ns + "/steps/")
        }
        named = set(nxt.values())
        return float(max(_len(k, nxt) for k in nxt if k not in named))


def _len(k: str, nxt: Mapping[str, str]) -> int:
    n = 0
    while k != "END":
        n, k = n + 1, nxt[k]
    return n
