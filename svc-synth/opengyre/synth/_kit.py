"""Seeded building blocks shared by the patterns: names, values, deterministic archives (byte-identical for a seed)."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
import zipfile
from collections.abc import Mapping
from typing import Any

__all__ = ["WORDS", "jdump", "name", "tar_gz", "token", "words", "zip_bytes"]

WORDS = [
    "amber",
    "basil",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kelp",
    "lumen",
    "maple",
    "nectar",
    "onyx",
    "pepper",
    "quartz",
    "raven",
    "sable",
    "tundra",
    "umber",
    "velvet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "aster",
    "birch",
    "cobalt",
    "dune",
    "ether",
    "flint",
    "grove",
    "heron",
    "iris",
    "jade",
    "kestrel",
    "lotus",
    "marsh",
    "nova",
    "opal",
    "pine",
    "quill",
    "reef",
    "slate",
    "thistle",
    "ultra",
    "vale",
    "wren",
]


def name(rng: random.Random, n: int = 2) -> str:
    return "-".join(rng.choice(WORDS) for _ in range(n))


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def token(rng: random.Random, n: int = 10) -> str:
    return "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ23456789") for _ in range(n))


def jdump(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def tar_gz(files: Mapping[str, bytes]) -> bytes:
    """A .tar.gz with fixed metadata (mtime 0, uid 0, mode 0644) so the same files give the same bytes."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for path in sorted(files):
            info = tarfile.TarInfo(path)
            info.size, info.mtime, info.mode = len(files[path]), 0, 0o644
            tf.addfile(info, io.BytesIO(files[path]))
    return gzip.compress(raw.getvalue(), mtime=0)


def zip_bytes(files: Mapping[str, bytes]) -> bytes:
    raw = io.BytesIO()
    with zipfile.ZipFile(raw, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(files):
            zf.writestr(zipfile.ZipInfo(path, date_time=(1980, 1, 1, 0, 0, 0)), files[path])
    return raw.getvalue()
