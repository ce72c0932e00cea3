"""Stale locks (error recovery): a job refuses to start until stale locks go; live ones must stay (knob: stale)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, Precondition, RubricItem, register

_JOB = """import os, sys
base = os.path.dirname(os.path.abspath(__file__))
live = set(open(os.path.join(base, "ACTIVE_HOLDERS.txt")).read().split())
held = {}
for fn in sorted(os.listdir(os.path.join(base, "locks"))):
    holder = open(os.path.join(base, "locks", fn)).read().split("holder=")[1].split()[0]
    held[holder] = fn
    if holder not in live:
        sys.exit(f"locked by {fn} (holder {holder})")
lost = live - set(held)
if lost:
    sys.exit(f"live lock(s) removed: {sorted(lost)}")
print(f"started with {len(held)} live lock(s)")
"""


class Config(msgspec.Struct, frozen=True):
    stale: int


@register
class StaleLock(Pattern):
    id = "stale-lock"
    dimension = "error-recovery"
    domains = frozenset({"local-service", "shell-scripting"})
    summary = "a job blocked by stale lock files among live ones that must be kept"
    goal = "unblock a job held by lock files"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"stale": (1, 2, 4, 6)}
    primary = "stale"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        holders = sorted({name(rng, 1) + str(i) for i in range(cfg.stale + 3)})
        live = holders[:3]
        files = {f"{ns}/job.py": _JOB.encode(), f"{ns}/ACTIVE_HOLDERS.txt": ("\n".join(live) + "\n").encode()}
        for h in holders:
            files[f"{ns}/locks/{rng.randrange(10**6):06d}-{h}.lock"] = (
                f"holder={h} since=2026-11-0{rng.randrange(1, 9)}\n".encode()
            )
        argv = ["python3", f"{ns}/job.py"]
        expect = "started with 3 live lock(s)"
        sol = (
            f"live = set(open({ns + '/ACTIVE_HOLDERS.txt'!r}).read().split())\nd = {ns + '/locks'!r}\n"
            "for fn in os.listdir(d):\n"
            "    holder = open(os.path.join(d, fn)).read().split('holder=')[1].split()[0]\n"
            "    if holder not in live: os.remove(os.path.join(d, fn))\n"
        )
        return Material(
            files=files,
            instruction=(
                f"`python3 {ns}/job.py` will not start because of stale locks in `{ns}/locks/`. Remove the "
                f"stale ones (holders not in `{ns}/ACTIVE_HOLDERS.txt`), keep the live ones, and get the job "
                "to start."
            ),
            facts={"output": expect},
            rubric=[
                RubricItem(
                    id=f"{cid}.starts", challenge=cid, weight=1.0, kind="command", argv=argv, expect_stdout=expect
                )
            ],
            solution=sol,
            evidence=sorted(files),
            preconditions=[Precondition(what="the job refuses to start", argv=argv, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        live = set(files[f"{ns}/ACTIVE_HOLDERS.txt"].decode().split())
        return float(
            sum(
                1
                for p, b in files.items()
                if p.startswith(f"{ns}/locks/") and b.decode().split("holder=")[1].split()[0] not in live
            )
        )
