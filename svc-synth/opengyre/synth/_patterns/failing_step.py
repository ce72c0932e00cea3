"""Failing step (error recovery): one step of an n-step pipeline reads a misspelt path (knob: steps)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, Precondition, RubricItem, register


class Config(msgspec.Struct, frozen=True):
    steps: int


@register
class FailingStep(Pattern):
    id = "failing-step"
    dimension = "error-recovery"
    domains = frozenset({"shell-scripting", "local-service"})
    summary = "a multi-step shell pipeline with one failing step to diagnose and repair"
    goal = "repair a shell pipeline"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"steps": (2, 4, 6, 9)}
    primary = "steps"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        start = rng.randrange(1, 100)
        bad = rng.randrange(cfg.steps)
        v = start
        files: dict[str, bytes] = {f"{ns}/data/s0.txt": f"{start}\n".encode()}
        for i in range(cfg.steps):
            add = rng.randrange(1, 50)
            src = f"data/s{i}.txt" if i != bad else f"data/S{i}.txt"
            files[f"{ns}/steps/step{i + 1}.sh"] = (
                f'#!/bin/bash\nset -e\nx=$(cat "{src}")\necho $(( x + {add} )) > data/s{i + 1}.txt\n'
            ).encode()
            v += add
        runner = (
            '#!/bin/bash\nset -e\ncd "$(dirname "$0")"\n'
            + "".join(f"bash steps/step{i + 1}.sh\n" for i in range(cfg.steps))
            + f"cat data/s{cfg.steps}.txt\n"
        )
        files[f"{ns}/pipeline.sh"] = runner.encode()
        argv = ["bash", f"{ns}/pipeline.sh"]
        step = f"{ns}/steps/step{bad + 1}.sh"
        return Material(
            files=files,
            instruction=(
                f"`bash {ns}/pipeline.sh` fails part-way. Find the failing step and fix it so the pipeline completes."
            ),
            facts={"output": str(v)},
            rubric=[
                RubricItem(
                    id=f"{cid}.completes", challenge=cid, weight=1.0, kind="command", argv=argv, expect_stdout=str(v)
                )
            ],
            solution=(
                f"p = {step!r}\ntext = open(p).read()\n"
                f"open(p, 'w').write(text.replace('data/S{bad}.txt', 'data/s{bad}.txt'))\n"
            ),
            given=["the failing command"],
            discover=[f"which of {cfg.steps} steps fails and why"],
            evidence=[f"{ns}/pipeline.sh", step],
            preconditions=[Precondition(what="the pipeline fails before the fix", argv=argv, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(ns + "/steps/")))
