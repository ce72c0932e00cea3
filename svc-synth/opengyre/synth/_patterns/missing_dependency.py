"""Missing dependency (error recovery): imports missing, renamed in vendor/ (knob: missing)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, Precondition, RubricItem, register


class Config(msgspec.Struct, frozen=True):
    missing: int


@register
class MissingDependency(Pattern):
    id = "missing-dependency"
    dimension = "error-recovery"
    domains = frozenset({"shell-scripting", "local-service"})
    summary = "a report script fails on missing modules that exist under other names in vendor/"
    goal = "get a report script running"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"missing": (1, 2, 3)}
    primary = "missing"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        mods = [f"util_{name(rng, 1)}_{i}" for i in range(cfg.missing)]
        consts = [rng.randrange(10, 999) for _ in mods]
        files: dict[str, bytes] = {}
        for m, c in zip(mods, consts, strict=True):
            files[f"{ns}/vendor/{m}-1.0.py"] = f"def value():\n    return {c}\n".encode()
        body = "".join(f"import {m}\n" for m in mods)
        body += "print(" + " + ".join(f"{m}.value()" for m in mods) + ")\n"
        files[f"{ns}/app/report.py"] = body.encode()
        files[f"{ns}/app/README.txt"] = b"report.py prints the combined value; vendored modules live in ../vendor.\n"
        total = str(sum(consts))
        sol = "import shutil\n" + "".join(
            f"shutil.copy({ns + '/vendor/' + m + '-1.0.py'!r}, {ns + '/app/' + m + '.py'!r})\n" for m in mods
        )
        argv = ["python3", f"{ns}/app/report.py"]
        return Material(
            files=files,
            instruction=f"`python3 {ns}/app/report.py` fails. Make it run and print its value (do not edit report.py).",
            facts={"output": total},
            rubric=[
                RubricItem(id=f"{cid}.runs", challenge=cid, weight=1.0, kind="command", argv=argv, expect_stdout=total)
            ],
            solution=sol,
            given=["the failing command"],
            discover=["which modules are missing and where they are vendored"],
            evidence=sorted(files),
            preconditions=[Precondition(what="report.py fails before the fix", argv=argv, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(files[f"{ns}/app/report.py"].count(b"import "))
