"""Consistent renaming (long-horizon consistency): one identifier renamed across n modules (knob: files)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import WORDS
from .._pattern import Material, Pattern, Precondition, RubricItem, register


class Config(msgspec.Struct, frozen=True):
    files: int


@register
class ConsistentRename(Pattern):
    id = "consistent-rename"
    dimension = "long-horizon-consistency"
    domains = frozenset({"text-processing", "shell-scripting", "git"})
    summary = "a function renamed consistently in every module that defines or calls it"
    goal = "rename a function throughout a codebase"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"files": (2, 4, 8, 16)}
    primary = "files"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        a, b = rng.sample(WORDS, 2)
        old, new = f"compute_{a}", f"calc_{b}_total"
        files = {f"{ns}/pkg/__init__.py": b"", f"{ns}/pkg/core.py": f"def {old}(x):\n    return x * 3 + 1\n".encode()}
        calls = []
        for i in range(cfg.files - 1):
            files[f"{ns}/pkg/m{i:02d}.py"] = (
                f"from pkg.core import {old}\n\n\ndef run():\n    return {old}({i})  # {old} on {i}\n"
            ).encode()
            calls.append(i * 3 + 1)
        files[f"{ns}/main.py"] = (
            "import importlib, os, sys\nsys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))\n"
            f"from pkg.core import {new}\n"
            "mods = sorted(f[:-3] for f in os.listdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), 'pkg')) "
            "if f.startswith('m'))\n"
            "print(sum(importlib.import_module('pkg.' + m).run() for m in mods))\n"
        ).encode()
        total = str(sum(calls))
        sol = (
            f"for root, _, fs in os.walk({ns!r}):\n    for f in fs:\n        p = os.path.join(root, f)\n"
            f"        t = open(p).read()\n        open(p, 'w').write(t.replace({old!r}, {new!r}))\n"
        )
        main = ["python3", f"{ns}/main.py"]
        return Material(
            files=files,
            instruction=(
                f"Rename the function `{old}` to `{new}` everywhere under `{ns}/` (definition, imports, calls "
                f"and comments) so that `python3 {ns}/main.py` runs; no trace of the old name may remain."
            ),
            facts={"output": total},
            rubric=[
                RubricItem(id=f"{cid}.runs", challenge=cid, weight=0.5, kind="command", argv=main, expect_stdout=total),
                RubricItem(
                    id=f"{cid}.no-old-name",
                    challenge=cid,
                    weight=0.5,
                    kind="command",
                    argv=["bash", "-c", f"test -d {ns} && ! grep -rq --include=*.py {old} {ns}"],
                ),
            ],
            solution=sol,
            given=["old and new name"],
            discover=[f"{cfg.files} files using it"],
            evidence=sorted(files),
            preconditions=[Precondition(what="main.py fails before the rename", argv=main, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for b in files.values() if b"compute_" in b))
