"""Config layers (environment understanding): effective values across layered overrides (knob: layers)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._pattern import Material, Pattern, answer_items, register, write_answer_py

_KEYS = ("port", "workers", "log_level", "cache_mb")
_NAMES = ("00-defaults", "10-site", "20-env", "30-host", "40-local")


class Config(msgspec.Struct, frozen=True):
    layers: int


@register
class ConfigLayers(Pattern):
    id = "config-layers"
    dimension = "environment-understanding"
    domains = frozenset({"configuration"})
    summary = "effective settings after layered config overrides, with a precedence file to honour"
    goal = "work out the settings in effect"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"layers": (1, 2, 3, 5)}
    primary = "layers"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        layers = list(_NAMES[: cfg.layers])
        order = layers[:]
        rng.shuffle(order)  # files sort one way, precedence is another
        eff: dict[str, Any] = {}
        files = {f"{ns}/PRECEDENCE.txt": ("lowest first:\n" + "\n".join(order) + "\n").encode()}
        content = {}
        for i, layer in enumerate(layers):
            kv = {k: str(rng.randrange(1, 9000)) for k in (_KEYS if i == 0 else rng.sample(_KEYS, 2))}
            content[layer] = kv
            files[f"{ns}/conf.d/{layer}.ini"] = "".join(f"{k} = {v}\n" for k, v in kv.items()).encode()
        for layer in order:
            eff.update(content[layer])
        sol = (
            f"order = open({ns + '/PRECEDENCE.txt'!r}).read().split()[2:]\neff = {{}}\n"
            f"for l in order:\n    for line in open(os.path.join({ns + '/conf.d'!r}, l + '.ini')):\n"
            "        k, v = (x.strip() for x in line.split('='))\n        eff[k] = v\n"
        ) + write_answer_py(cid, "eff")
        return Material(
            files=files,
            instruction=(
                f"The settings in `{ns}/conf.d/` override each other in the order `{ns}/PRECEDENCE.txt` "
                f"gives. Write the effective value of {', '.join(_KEYS)} (as strings) as JSON to "
                f"`answers/{cid}.json`."
            ),
            facts=eff,
            rubric=answer_items(cid, eff),
            solution=sol,
            evidence=sorted(files),
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        return float(sum(1 for p in files if p.startswith(f"{ns}/conf.d/")))
