"""Seeded building blocks shared by the patterns: names, values, deterministic archives (byte-identical for a seed)."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import random
import tarfile
import zipfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["WORDS", "Commit", "git_repo", "jdump", "name", "tar_gz", "token", "words", "zip_bytes"]

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


@dataclass(frozen=True)
class Commit:
    """One commit of a linear history: the whole (flat) tree it records, its message and its time (Unix s)."""

    files: Mapping[str, bytes]
    message: str
    time: int
    author: str = "Dev <dev@example.invalid>"


def _object(kind: str, body: bytes) -> tuple[str, bytes]:
    raw = f"{kind} {len(body)}\0".encode() + body
    return hashlib.sha1(raw).hexdigest(), zlib.compress(raw, 0)  # stored blocks: the same bytes on any zlib


def git_repo(history: Sequence[Commit], branch: str = "main") -> tuple[dict[str, bytes], list[str]]:
    """A git repository as files (``.git/`` with loose objects, ``HEAD``, the branch ref, a config; the working tree
    of the last commit), byte-identical for the same history, and the commits' hashes oldest first. Git reads it
    as any repository (``log``, ``show``, ``blame``); there is no index, so ``status`` sees every file as staged
    for deletion and untracked."""
    files: dict[str, bytes] = {}
    shas: list[str] = []
    for c in history:
        entries = b""
        for path in sorted(c.files):  # flat trees: entries sort by name
            if "/" in path or not path:
                raise ValueError(f"git_repo builds flat trees; {path!r} is not a file name")
            sha, obj = _object("blob", c.files[path])
            files[f".git/objects/{sha[:2]}/{sha[2:]}"] = obj
            entries += f"100644 {path}\0".encode() + bytes.fromhex(sha)
        tree, obj = _object("tree", entries)
        files[f".git/objects/{tree[:2]}/{tree[2:]}"] = obj
        head = f"tree {tree}\n" + (f"parent {shas[-1]}\n" if shas else "")
        head += f"author {c.author} {c.time} +0000\ncommitter {c.author} {c.time} +0000\n\n{c.message}\n"
        sha, obj = _object("commit", head.encode())
        files[f".git/objects/{sha[:2]}/{sha[2:]}"] = obj
        shas.append(sha)
    files[".git/HEAD"] = f"ref: refs/heads/{branch}\n".encode()
    files[f".git/refs/heads/{branch}"] = f"{shas[-1]}\n".encode()
    files[".git/config"] = b"[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n"
    files.update(history[-1].files)
    return files, shas
