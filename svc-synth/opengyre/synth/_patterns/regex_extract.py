"""Regex extraction (skill use): ticket ids written in several formats, normalised (knob: formats)."""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import words
from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_FORMATS = ("OPS-{n}", "ops_{n}", "[OPS {n}]", "OPS#{n}")
_RX = (r"OPS-(\d+)", r"ops_(\d+)", r"\[OPS (\d+)\]", r"OPS#(\d+)")


class Config(msgspec.Struct, frozen=True):
    formats: int


@register
class RegexExtract(Pattern):
    id = "regex-extract"
    dimension = "skill-use"
    domains = frozenset({"text-processing", "logs"})
    summary = "identifiers in mixed notations extracted and normalised"
    goal = "extract and normalise identifiers from text"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"formats": (1, 2, 3, 4)}
    primary = "formats"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        ids: set[int] = set()
        lines = []
        for f in range(cfg.formats):
            for _ in range(3):
                n = rng.randrange(100, 999)
                ids.add(n)
                lines.append(f"{words(rng, 3)} {_FORMATS[f].format(n=n)} {words(rng, 2)}")
        for _ in range(5):
            lines.append(f"{words(rng, 4)} OPX-{rng.randrange(100, 999)} {rng.randrange(100, 999)}")
        rng.shuffle(lines)
        files = {f"{ns}/notes.txt": ("\n".join(lines) + "\n").encode()}
        answer = sorted(f"OPS-{n}" for n in ids)
        sol = (
            f"import re\ntext = open({ns + '/notes.txt'!r}).read()\nfound = set()\n"
            f"for rx in {list(_RX)!r}:\n    found |= {{'OPS-' + m for m in re.findall(rx, text)}}\n"
        ) + write_answer_py(cid, "{'tickets': sorted(found)}")
        return Material(
            files=files,
            instruction=(
                f"`{ns}/notes.txt` mentions OPS tickets in various notations (OPX is another project). "
                f'Write every distinct ticket as `OPS-<number>`, sorted, as `{{"tickets": [...]}}` to '
                f"`answers/{cid}.json`."
            ),
            facts={"tickets": answer},
            rubric=answer_items(cid, {"tickets": answer}),
            solution=sol,
            discover=["the notations in use"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        text = files[f"{ns}/notes.txt"].decode()
        return float(sum(1 for rx in _RX if re.search(rx, text)))
