"""Multi-stage transform (planning): a text through the stages a plan lists, in order (knob: stages)."""

from __future__ import annotations

import codecs
import random
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import words
from .._pattern import Material, Pattern, RubricItem, register

_STAGES: dict[str, Callable[[str], str]] = {
    "upper": str.upper,
    "lower": str.lower,
    "reverse-words": lambda t: " ".join(reversed(t.split())),
    "sort-words": lambda t: " ".join(sorted(t.split())),
    "dedupe-words": lambda t: " ".join(dict.fromkeys(t.split())),
    "rot13": lambda t: codecs.encode(t, "rot13"),
    "drop-vowels": lambda t: "".join(c for c in t if c.lower() not in "aeiou"),
}


class Config(msgspec.Struct, frozen=True):
    stages: int


@register
class MultiStageTransform(Pattern):
    id = "multi-stage-transform"
    dimension = "planning"
    domains = frozenset({"text-processing", "shell-scripting"})
    summary = "a text transformed by an ordered plan of stages whose order matters"
    goal = "carry a text through a plan of stages"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"stages": (1, 3, 5, 8)}
    primary = "stages"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        text = words(rng, 12)
        plan = [rng.choice(sorted(_STAGES)) for _ in range(cfg.stages)]
        out = text
        for s in plan:
            out = _STAGES[s](out)
        files = {f"{ns}/input.txt": (text + "\n").encode(), f"{ns}/PLAN.txt": ("\n".join(plan) + "\n").encode()}
        sol = (
            "import codecs\nS = {'upper': str.upper, 'lower': str.lower,\n"
            "     'reverse-words': lambda t: ' '.join(reversed(t.split())),\n"
            "     'sort-words': lambda t: ' '.join(sorted(t.split())),\n"
            "     'dedupe-words': lambda t: ' '.join(dict.fromkeys(t.split())),\n"
            "     'rot13': lambda t: codecs.encode(t, 'rot13'),\n"
            "     'drop-vowels': lambda t: ''.join(c for c in t if c.lower() not in 'aeiou')}\n"
            f"t = open({ns + '/input.txt'!r}).read().strip()\n"
            f"for s in open({ns + '/PLAN.txt'!r}).read().split(): t = S[s](t)\n"
            f"open({ns + '/output.txt'!r}, 'w').write(t + '\\n')\n"
        )
        doc = "; ".join(f"`{k}`" for k in sorted(_STAGES))
        return Material(
            files=files,
            instruction=(
                f"Apply the stages listed in `{ns}/PLAN.txt`, in order, to the text of `{ns}/input.txt` and "
                f"write the result to `{ns}/output.txt`. Stages: {doc} (words are split on whitespace; "
                "drop-vowels removes a, e, i, o, u in either case)."
            ),
            facts={"output": out},
            rubric=[
                RubricItem(
                    id=f"{cid}.output",
                    challenge=cid,
                    weight=1.0,
                    kind="text_equals",
                    file=f"{ns}/output.txt",
                    expected=out,
                )
            ],
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(len(files[f"{ns}/PLAN.txt"].split()))
