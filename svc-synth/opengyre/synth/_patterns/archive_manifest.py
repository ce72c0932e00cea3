"""Archive manifest (skill use): sizes of matching members inside a tarball, without trusting names (knob: members)."""

from __future__ import annotations

import io
import random
import tarfile
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name, tar_gz, words
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    members: int


@register
class ArchiveManifest(Pattern):
    id = "archive-manifest"
    dimension = "skill-use"
    domains = frozenset({"files-and-archives", "shell-scripting"})
    summary = "count and total size of the .log members of a tarball"
    goal = "count and size the log files inside an archive"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"members": (3, 6, 12, 24)}
    primary = "members"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        members: dict[str, bytes] = {}
        for i in range(cfg.members):
            ext = ".log" if i % 2 == 0 else rng.choice((".txt", ".log.bak", ".cfg"))
            members[f"{name(rng, 1)}/{i:02d}{ext}"] = (words(rng, rng.randrange(3, 30)) + "\n").encode()
        logs = [v for k, v in members.items() if k.endswith(".log")]
        facts = {"count": len(logs), "bytes": sum(len(v) for v in logs)}
        files = {f"{ns}/backup.tar.gz": tar_gz(members)}
        sol = (
            f"import tarfile\nms = [m for m in tarfile.open({ns + '/backup.tar.gz'!r}).getmembers() "
            "if m.isfile() and m.name.endswith('.log')]\n"
        ) + write_answer_py(cid, "{'count': len(ms), 'bytes': sum(m.size for m in ms)}")
        return Material(
            files=files,
            instruction=(
                f"How many `.log` members does `{ns}/backup.tar.gz` hold, and how many bytes together? Write "
                f'`{{"count": n, "bytes": b}}` to `answers/{cid}.json`.'
            ),
            facts=facts,
            rubric=answer_items(cid, facts),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        with tarfile.open(fileobj=io.BytesIO(files[f"{ns}/backup.tar.gz"])) as tf:
            return float(len(tf.getmembers()))
