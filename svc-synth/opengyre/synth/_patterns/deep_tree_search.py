"""Deep tree search (environment understanding): one marker file deep in a decoy-filled tree (knob: depth)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name, token
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    depth: int


@register
class DeepTreeSearch(Pattern):
    id = "deep-tree-search"
    dimension = "environment-understanding"
    domains = frozenset({"files-and-archives", "shell-scripting"})
    summary = "the one file carrying a marker, deep in a tree of look-alike folders"
    goal = "locate one file in a directory tree"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"depth": (1, 3, 5, 8)}
    primary = "depth"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        marker = f"MARK-{token(rng, 8)}"
        files = {}
        path = ns + "/tree"
        for d in range(cfg.depth):
            for _ in range(2):  # decoy siblings at every level
                files[f"{path}/{name(rng, 1)}{d}x/notes.txt"] = f"marker: MARK-{token(rng, 8)}-expired\n".encode()
            path += f"/{name(rng, 1)}{d}"
        files[f"{path}/notes.txt"] = f"marker: {marker}\n".encode()
        rel = path[len(ns) + 1 :] + "/notes.txt"
        sol = (
            f"for root, _, fs in os.walk({ns!r}):\n    for f in fs:\n        p = os.path.join(root, f)\n"
            "        t = open(p).read().strip()\n"
            "        if t.startswith('marker: MARK-') and not t.endswith('-expired'): found = (p, t.split(': ')[1])\n"
        ) + write_answer_py(cid, f"{{'path': os.path.relpath(found[0], {ns!r}), 'marker': found[1]}}")
        facts = {"path": rel, "marker": marker}
        return Material(
            files=files,
            instruction=(
                f"Somewhere under `{ns}/tree/` one notes file holds a live marker (expired ones end in "
                f'`-expired`). Write `{{"path": "<path relative to {ns}>", "marker": "..."}}` to '
                f"`answers/{cid}.json`."
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            discover=[f"a file {cfg.depth} levels deep"],
            evidence=[f"{path}/notes.txt"],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        live = next(p for p, b in files.items() if p.startswith(ns + "/") and not b.strip().endswith(b"-expired"))
        return float(live.count("/") - 2)
