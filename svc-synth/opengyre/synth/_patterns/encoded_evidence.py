"""Encoded evidence (skill use): a value wrapped in k encodings (base64, hex, gzip) to peel (knob: layers)."""

from __future__ import annotations

import base64
import gzip
import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import token
from .._pattern import Material, Pattern, answer_items, register, write_answer_py


class Config(msgspec.Struct, frozen=True):
    layers: int


def _peel(data: bytes) -> tuple[bytes, int]:
    n = 0
    while not data.startswith(b"value="):
        if data.startswith(b"b64:"):
            data = base64.b64decode(data[4:])
        elif data.startswith(b"hex:"):
            data = bytes.fromhex(data[4:].decode())
        elif data.startswith(b"gz:"):
            data = gzip.decompress(base64.b64decode(data[3:]))
        n += 1
    return data, n


@register
class EncodedEvidence(Pattern):
    id = "encoded-evidence"
    dimension = "skill-use"
    domains = frozenset({"text-processing", "files-and-archives"})
    summary = "a value under several layers of tagged encodings"
    goal = "recover an encoded value"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"layers": (1, 2, 3, 5)}
    primary = "layers"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        secret = token(rng, 10)
        data = f"value={secret}".encode()
        for _ in range(cfg.layers):
            kind = rng.choice(("b64", "hex", "gz"))
            if kind == "b64":
                data = b"b64:" + base64.b64encode(data)
            elif kind == "hex":
                data = b"hex:" + data.hex().encode()
            else:
                data = b"gz:" + base64.b64encode(gzip.compress(data, mtime=0))
        files = {f"{ns}/payload.txt": data + b"\n"}
        sol = (
            "import base64, gzip\n"
            f"d = open({ns + '/payload.txt'!r}, 'rb').read().strip()\n"
            "while not d.startswith(b'value='):\n"
            "    if d.startswith(b'b64:'): d = base64.b64decode(d[4:])\n"
            "    elif d.startswith(b'hex:'): d = bytes.fromhex(d[4:].decode())\n"
            "    else: d = gzip.decompress(base64.b64decode(d[3:]))\n"
        ) + write_answer_py(cid, "{'value': d.decode().split('=', 1)[1]}")
        return Material(
            files=files,
            instruction=(
                f"`{ns}/payload.txt` is encoded in tagged layers (`b64:`, `hex:`, `gz:` = gzip then base64). "
                f'Decode it down to `value=...` and write `{{"value": "..."}}` to `answers/{cid}.json`.'
            ),
            facts={"value": secret},
            rubric=answer_items(cid, {"value": secret}),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(_peel(files[f"{ns}/payload.txt"].strip())[1])
