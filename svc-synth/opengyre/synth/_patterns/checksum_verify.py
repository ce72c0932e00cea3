"""Checksum verification (skill use): files against a sha256 manifest, a few corrupted (knob: files)."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import words
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    files: int


@register
class ChecksumVerify(Pattern):
    id = "checksum-verify"
    dimension = "skill-use"
    domains = frozenset({"files-and-archives", "shell-scripting"})
    summary = "files checked against a sha256 manifest to find the corrupted ones"
    goal = "find the files that fail their checksums"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"files": (3, 6, 12, 24)}
    primary = "files"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        files, manifest, bad = {}, [], []
        for i in range(cfg.files):
            good = (words(rng, 12) + "\n").encode()
            fn = f"part_{i:02d}.dat"
            manifest.append(f"{hashlib.sha256(good).hexdigest()}  {fn}")
            if i == 0 or rng.random() < 0.25:
                bad.append(fn)
                good = good[:-2] + b"#\n"
            files[f"{ns}/data/{fn}"] = good
        files[f"{ns}/SHA256SUMS"] = ("\n".join(manifest) + "\n").encode()
        sol = (
            f"import hashlib\nbad = []\nfor line in open({ns + '/SHA256SUMS'!r}):\n"
            "    h, fn = line.split()\n"
            f"    data = open(os.path.join({ns + '/data'!r}, fn), 'rb').read()\n"
            "    if hashlib.sha256(data).hexdigest() != h: bad.append(fn)\n"
        ) + write_answer_py(cid, "{'corrupted': sorted(bad)}")
        facts = {"corrupted": sorted(bad)}
        return Material(
            files=files,
            instruction=(
                f"Some files in `{ns}/data/` do not match `{ns}/SHA256SUMS`. Write their names, sorted, as "
                f'`{{"corrupted": [...]}}` to `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
            bins=("bash", "python3", "sha256sum"),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/data/")))
