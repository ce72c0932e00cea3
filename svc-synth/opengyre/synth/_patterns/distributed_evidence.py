"""Distributed evidence: a record's complementary facts are split across N source files (knob: sources)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name, token, words
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    sources: int


@register
class DistributedEvidence(Pattern):
    id = "distributed-evidence"
    dimension = "environment-understanding"
    domains = frozenset({"logs", "csv-json-data"})
    summary = "complementary facts of one record split across several source files"
    goal = "assemble one record from several sources"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"sources": (1, 2, 4, 6)}
    primary = "sources"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        subject = name(rng)
        fields = [f"field_{i}" for i in range(max(cfg.sources, 2))]
        facts = {f: token(rng, 8) for f in fields}
        files: dict[str, bytes] = {}
        # Field i lives in source i % sources: one source holds all of them at level 1.
        for s in range(cfg.sources):
            lines = [f"# notes {s}: {words(rng, 6)}"]
            for i, f in enumerate(fields):
                if i % cfg.sources == s:
                    lines.append(f"{subject}.{f} = {facts[f]}")
                lines.append(f"{name(rng)}.{f} = {token(rng, 8)}")
            files[f"{ns}/source_{s}.txt"] = ("\n".join(lines) + "\n").encode()
        sol = (
            f"facts = {{}}\nfor fn in sorted(os.listdir({ns!r})):\n"
            f"    for line in open(os.path.join({ns!r}, fn)):\n"
            f"        if line.startswith({subject + '.'!r}):\n"
            f"            k, v = line.split(' = ')\n            facts[k.split('.', 1)[1]] = v.strip()\n"
        ) + write_answer_py(cid, "facts")
        return Material(
            files=files,
            instruction=(
                f"The notes under `{ns}/` describe the record `{subject}`. Collect every field of `{subject}` "
                f"({', '.join(fields)}) and write them as a JSON object to `answers/{cid}.json`."
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            given=[f"record name {subject}", "field names"],
            discover=[f"which of {cfg.sources} sources holds each field"],
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        # Sources holding at least one of the record's facts.
        return float(sum(1 for b in files.values() if any(str(v).encode() in b for v in facts.values())))
