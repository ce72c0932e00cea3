"""Log counting (skill use): error codes counted across several service logs (knob: files)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import words
from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_CODES = ("E101", "E202", "E303")


class Config(msgspec.Struct, frozen=True):
    files: int


@register
class LogCount(Pattern):
    id = "log-count"
    dimension = "skill-use"
    domains = frozenset({"logs"})
    summary = "error codes counted across every service log"
    goal = "count error codes in service logs"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"files": (1, 3, 6, 10)}
    primary = "files"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        counts = dict.fromkeys(_CODES, 0)
        files = {}
        for f in range(cfg.files):
            lines = []
            for i in range(rng.randrange(10, 30)):
                if rng.random() < 0.3:
                    c = rng.choice(_CODES)
                    counts[c] += 1
                    lines.append(f"{i:04d} ERROR code={c} {words(rng, 3)}")
                else:
                    lines.append(f"{i:04d} INFO {words(rng, 4)} (was code={rng.choice(_CODES)} earlier)")
            files[f"{ns}/logs/service_{f}.log"] = ("\n".join(lines) + "\n").encode()
        sol = (
            f"c = dict.fromkeys({list(_CODES)!r}, 0)\nd = {ns + '/logs'!r}\n"
            "for fn in os.listdir(d):\n"
            "    for line in open(os.path.join(d, fn)):\n"
            "        if ' ERROR code=' in line: c[line.split('code=')[1].split()[0]] += 1\n"
        ) + write_answer_py(cid, "c")
        return Material(
            files=files,
            instruction=(
                f"Count the ERROR lines per code ({', '.join(_CODES)}) across all logs in `{ns}/logs/` (INFO "
                f"lines mentioning a code do not count); write code -> count as JSON to `answers/{cid}.json`."
            ),
            facts=counts,
            rubric=answer_items(cid, counts),
            solution=sol,
            discover=[f"{cfg.files} log files"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/logs/")))
