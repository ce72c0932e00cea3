"""Permission denied (error recovery): helpers that lost their exec bit (knob: broken)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, Precondition, RubricItem, register


class Config(msgspec.Struct, frozen=True):
    broken: int


@register
class PermissionDenied(Pattern):
    id = "permission-denied"
    dimension = "error-recovery"
    domains = frozenset({"shell-scripting", "local-service", "files-and-archives"})
    summary = "a runner fails with 'Permission denied' on helpers that lost their executable bit"
    goal = "get a runner's helpers to run"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"broken": (1, 2, 4, 6)}
    primary = "broken"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        n = cfg.broken + 2
        files, execs, total = {}, set(), 0
        broken = set(rng.sample(range(n), cfg.broken))
        for i in range(n):
            v = rng.randrange(1, 100)
            total += v
            files[f"{ns}/bin/step{i}.sh"] = f"#!/bin/bash\necho {v}\n".encode()
            if i not in broken:
                execs.add(f"{ns}/bin/step{i}.sh")
        files[f"{ns}/run.sh"] = (
            '#!/bin/bash\nset -e\ncd "$(dirname "$0")"\nt=0\n'
            + "".join(f"v=$(./bin/step{i}.sh)\nt=$(( t + v ))\n" for i in range(n))
            + "echo $t\n"
        ).encode()
        argv = ["bash", f"{ns}/run.sh"]
        sol = f"for fn in os.listdir({ns + '/bin'!r}): os.chmod(os.path.join({ns + '/bin'!r}, fn), 0o755)\n"
        return Material(
            files=files,
            instruction=(
                f"`bash {ns}/run.sh` stops with an error. Repair the helpers (not run.sh) so it prints its total."
            ),
            facts={"output": str(total)},
            rubric=[
                RubricItem(
                    id=f"{cid}.runs", challenge=cid, weight=1.0, kind="command", argv=argv, expect_stdout=str(total)
                )
            ],
            solution=sol,
            evidence=sorted(files),
            executables=execs | {f"{ns}/run.sh"},
            preconditions=[Precondition(what="run.sh fails before the repair", argv=argv, expect_exit="nonzero")],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        # Helpers in bin/: the broken ones plus two that work (the files alone carry no mode bits).
        return float(sum(1 for p in files if p.startswith(f"{ns}/bin/")))
