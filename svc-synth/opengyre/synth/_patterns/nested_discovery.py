"""Nested discovery: the evidence sits inside archives nested d deep, each layer with decoys (knob: depth)."""

from __future__ import annotations

import io
import random
import tarfile
import zipfile
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import tar_gz, token, words, zip_bytes
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    depth: int


@register
class NestedDiscovery(Pattern):
    id = "nested-discovery"
    dimension = "environment-understanding"
    domains = frozenset({"files-and-archives"})
    summary = "evidence hidden in nested archives (tar.gz and zip alternating), decoys at every layer"
    goal = "find evidence inside archives"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"depth": (1, 2, 3, 4)}
    primary = "depth"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        secret = token(rng, 12)
        inner: dict[str, bytes] = {"ticket.txt": f"access-code: {secret}\n".encode()}
        for layer in range(cfg.depth):
            inner[f"readme_{layer}.txt"] = f"layer {layer}: {words(rng, 5)}\naccess-code: none\n".encode()
            blob = tar_gz(inner) if layer % 2 == 0 else zip_bytes(inner)
            inner = {f"bundle_{layer}.{'tar.gz' if layer % 2 == 0 else 'zip'}": blob}
        files = {f"{ns}/{k}": v for k, v in inner.items()}
        sol = (
            "import io, tarfile, zipfile\n"
            "def _walk(nm, data):\n"
            "    if nm.endswith('.tar.gz'):\n"
            "        with tarfile.open(fileobj=io.BytesIO(data)) as t:\n"
            "            for m in t.getmembers():\n"
            "                if m.isfile(): yield from _walk(m.name, t.extractfile(m).read())\n"
            "    elif nm.endswith('.zip'):\n"
            "        with zipfile.ZipFile(io.BytesIO(data)) as z:\n"
            "            for n in z.namelist(): yield from _walk(n, z.read(n))\n"
            "    else:\n"
            "        yield nm, data\n"
            f"for fn in os.listdir({ns!r}):\n"
            f"    for nm, data in _walk(fn, open(os.path.join({ns!r}, fn), 'rb').read()):\n"
            "        for line in data.decode().splitlines():\n"
            "            if line.startswith('access-code: ') and line.split(': ')[1] != 'none':\n"
            "                code = line.split(': ')[1]\n"
        ) + write_answer_py(cid, "{'access_code': code}")
        return Material(
            files=files,
            instruction=(
                f"An access code is stored somewhere inside the bundle in `{ns}/`. Write it to `answers/{cid}.json` "
                'as `{"access_code": "..."}`.'
            ),
            facts={"access_code": secret},
            rubric=answer_items(cid, {"access_code": secret}),
            solution=sol,
            given=["the bundle's folder"],
            discover=[f"the archive layers ({cfg.depth}) and the file holding the code"],
            evidence=sorted(files),
            bins=("bash", "python3", "tar", "unzip"),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(max(_depth(p, b) for p, b in files.items() if p.startswith(ns + "/")))


def _depth(nm: str, data: bytes) -> int:
    if nm.endswith(".tar.gz"):
        with tarfile.open(fileobj=io.BytesIO(data)) as t:
            return 1 + max(_depth(m.name, t.extractfile(m).read()) for m in t.getmembers() if m.isfile())  # type: ignore[union-attr]
    if nm.endswith(".zip"):
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return 1 + max(_depth(n, z.read(n)) for n in z.namelist())
    return 0
