"""Broken configuration (error recovery): a service refuses a config with k faults against its spec (knob: faults)."""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, ClassVar

import msgspec

from .._kit import name
from .._pattern import Material, Pattern, Precondition, RubricItem, register


class Config(msgspec.Struct, frozen=True):
    faults: int


_SERVICE = """import sys
spec = dict(l.split(":", 1) for l in open(sys.argv[1] + "/SPEC.txt").read().split("\\n") if ":" in l)
spec = {k.strip(): v.strip() for k, v in spec.items()}
conf = {}
for n, line in enumerate(open(sys.argv[1] + "/service.conf"), 1):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    if "=" not in line:
        sys.exit(f"service.conf:{n}: expected key = value")
    k, v = (x.strip() for x in line.split("=", 1))
    conf[k] = v
for k, kind in spec.items():
    if k not in conf:
        sys.exit(f"missing key {k}")
    v = conf[k]
    if kind == "int" and not v.isdigit():
        sys.exit(f"{k}: not an int")
    if kind == "bool" and v not in ("true", "false"):
        sys.exit(f"{k}: not a bool")
print("OK " + ",".join(f"{k}={conf[k]}" for k in sorted(spec)))
"""


@register
class BrokenConfiguration(Pattern):
    id = "broken-configuration"
    dimension = "error-recovery"
    domains = frozenset({"configuration", "local-service"})
    summary = "a service refuses its configuration: missing keys, wrong types, malformed lines against a spec"
    goal = "get a service to accept its configuration"
    config = Config
    knobs: ClassVar[dict[str, tuple[int, ...]]] = {"faults": (1, 2, 4)}
    primary = "faults"

    def build(self, cfg: Config, rng: random.Random, ns: str, cid: str) -> Material:
        keys: list[str] = []
        while len(keys) < 6:
            k = name(rng, 1) + "_" + rng.choice(("port", "workers", "enabled", "retries", "debug", "limit"))
            if k not in keys:
                keys.append(k)
        kinds = {k: ("bool" if k.endswith(("enabled", "debug")) else "int") for k in keys}

        def value(k: str) -> str:
            return rng.choice(("true", "false")) if kinds[k] == "bool" else str(rng.randrange(1, 9000))

        # NOTES documents a default for every key, not only the broken ones (listing those would name the faults):
        # a key the config sets validly keeps its own value, which differs from the default, so rewriting the
        # config from NOTES is wrong too; only a key whose setting is unusable takes its default.
        defaults = {k: value(k) for k in keys}
        setting = {}
        for k in keys:
            if kinds[k] == "bool":
                setting[k] = "false" if defaults[k] == "true" else "true"
            else:
                setting[k] = value(k)
                while setting[k] == defaults[k]:
                    setting[k] = value(k)
        faulty = rng.sample(keys, cfg.faults)
        good = {k: (defaults[k] if k in faulty else setting[k]) for k in keys}
        broken = dict(setting)
        lines_extra: list[str] = []
        for i, k in enumerate(faulty):
            mode = i % 3
            if mode == 0:
                broken.pop(k)  # missing key: its default is in NOTES
            elif mode == 1:  # wrong type; the default is what the broken value meant
                broken[k] = defaults[k] + ("x" if kinds[k] == "int" else "_maybe")
            else:  # malformed: no '='; the default is what it meant
                broken.pop(k)
                lines_extra.append(f"{k} {defaults[k]}")
        conf = "".join(f"{k} = {v}\n" for k, v in broken.items()) + "".join(x + "\n" for x in lines_extra)
        notes = [f"default {k} is {defaults[k]}\n" for k in keys]
        rng.shuffle(notes)
        files = {
            f"{ns}/SPEC.txt": "".join(f"{k}: {kinds[k]}\n" for k in keys).encode(),
            f"{ns}/NOTES.txt": "".join(notes).encode(),
            f"{ns}/service.conf": conf.encode(),
            f"{ns}/service.py": _SERVICE.encode(),
        }
        expect = "OK " + ",".join(f"{k}={good[k]}" for k in sorted(keys))
        fixed = "".join(f"{k} = {good[k]}\n" for k in keys)
        argv = ["python3", f"{ns}/service.py", ns]
        return Material(
            files=files,
            instruction=(
                f"`python3 {ns}/service.py {ns}` refuses `{ns}/service.conf`. Repair the configuration so the service "
                f"starts and prints OK: keep every setting the service accepts as it is, and give each key whose "
                f"setting is missing or unusable its default from `{ns}/NOTES.txt` (do not edit service.py)."
            ),
            facts={"output": expect},
            rubric=[
                RubricItem(
                    id=f"{cid}.starts", challenge=cid, weight=1.0, kind="command", argv=argv, expect_stdout=expect
                )
            ],
            solution=f"open({ns + '/service.conf'!r}, 'w').write({fixed!r})\n",
            given=["the failing command"],
            discover=[f"{cfg.faults} faults against SPEC.txt and their keys' defaults"],
            infer=["which keys are faulty: NOTES documents every key"],
            evidence=sorted(files),
            preconditions=[
                Precondition(what="the service refuses the initial config", argv=argv, expect_exit="nonzero")
            ],
        )

    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        spec = dict(line.split(": ") for line in files[f"{ns}/SPEC.txt"].decode().splitlines())
        conf = {}
        for line in files[f"{ns}/service.conf"].decode().splitlines():
            if "=" in line:
                k, v = (x.strip() for x in line.split("=", 1))
                conf[k] = v
        ok = sum(
            1
            for k, t in spec.items()
            if k in conf and (conf[k].isdigit() if t == "int" else conf[k] in ("true", "false"))
        )
        return float(len(spec) - ok)
