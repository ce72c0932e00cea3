"""The blueprint: the author-side contract a task is derived from (goal, challenges with knob values, facts and
derivations, information boundary, acceptance criteria), and the procedural drafting of one from a skill."""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Literal

import msgspec

from ._catalogue import get_pattern
from ._pattern import DIMENSIONS, Material, RubricItem

__all__ = ["Blueprint", "Boundary", "Challenge", "load_blueprint", "materials", "seeded_rng"]

_CID = re.compile(r"c[0-9]{1,4}")
_OMITTED_EMPTY = ("skill_files", "domain")
_SKILL_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # agentskills.io's name: also a folder name of the task


class Challenge(msgspec.Struct, frozen=True, kw_only=True):
    cid: str  # c0, c1, ...: names the challenge's folder and answer file
    pattern_id: str
    knobs: dict[str, int]


class Boundary(msgspec.Struct, frozen=True, kw_only=True):
    given: list[str] = msgspec.field(default_factory=list)
    discover: list[str] = msgspec.field(default_factory=list)
    infer: list[str] = msgspec.field(default_factory=list)


class Blueprint(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    version: int
    skill_id: str
    skill_name: str
    goal: str
    seed: int
    capabilities: dict[str, float]  # the five dimensions, each 0..1
    challenges: list[Challenge]
    facts: dict[str, Any] = msgspec.field(default_factory=dict)  # "<cid>.<fact>" -> value
    derivations: list[str] = msgspec.field(default_factory=list)
    boundary: Boundary = msgspec.field(default_factory=Boundary)
    acceptance: list[RubricItem] = msgspec.field(default_factory=list)
    pass_threshold: float = 0.5
    parent_version: int | None = None
    origin: str = "procedural"  # or "llm": both pass the same gates
    # Each challenge's workspace folder: "cid" is ``c0/``; "cid-pattern" (``c0-coupled-constraints/``, what tasks
    # were built with before) names the pattern, which tells a solver what kind of trap the folder holds.
    layout: Literal["cid", "cid-pattern"] = "cid"
    # The skill travels with the task (``environment/skills/<skill_name>/``, Harbor's ``skills_dir``): each of its
    # files by skill-relative path and sha256, so a rebuild from this blueprint refuses other files. Empty: a task
    # built before skills travelled (or one whose skill is not on disk), which ships none.
    skill_files: dict[str, str] = msgspec.field(default_factory=dict)
    domain: str = ""  # the skill's domain: what its patterns were drawn for, and hardening adds for

    def folder(self, c: Challenge) -> str:
        return c.cid if self.layout == "cid" else f"{c.cid}-{c.pattern_id}"

    def validate(self) -> None:
        if not self.challenges:
            raise ValueError("a blueprint needs at least one challenge")
        if set(self.capabilities) - set(DIMENSIONS):
            raise ValueError(f"unknown capability dimension(s) {sorted(set(self.capabilities) - set(DIMENSIONS))}")
        if len({c.cid for c in self.challenges}) != len(self.challenges):
            raise ValueError("challenge ids repeat")
        for c in self.challenges:  # a folder name and part of solve.py's code: c0, c1, ...
            if not _CID.fullmatch(c.cid):
                raise ValueError(f"challenge id {c.cid!r} is not c<number>")
        for c in self.challenges:
            get_pattern(c.pattern_id).make_config(c.knobs)
        if not 0.0 < self.pass_threshold <= 1.0:
            raise ValueError("pass_threshold must be in (0, 1]")
        if self.skill_files and not _SKILL_NAME.fullmatch(self.skill_name):
            raise ValueError(f"skill name {self.skill_name!r} is not a skill's name (lowercase letters, digits, -)")
        for rel in self.skill_files:
            parts = rel.split("/")
            if rel.startswith("/") or any(part in ("", ".", "..") for part in parts):
                raise ValueError(f"skill file {rel!r} is not a relative path inside the skill")

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()

    def encode(self) -> bytes:
        """The blueprint as ``tests/blueprint.json`` holds it (compact). The fields added since tasks shipped their
        skill are left out while empty, so a blueprint without them encodes, digests and rebuilds to the bytes it
        had before they existed."""
        raw = msgspec.to_builtins(self)
        for key in _OMITTED_EMPTY:
            if not raw.get(key):
                raw.pop(key, None)
        return msgspec.json.encode(raw)


def load_blueprint(data: bytes) -> Blueprint:
    """A ``tests/blueprint.json``. One written before ``layout`` existed was built in the layout that names
    patterns, and is read as such, so it still rebuilds to the bytes it was built as. Raises msgspec's
    ``DecodeError`` / ``ValidationError`` for what is not a blueprint."""
    raw = msgspec.json.decode(data)
    if isinstance(raw, dict) and "layout" not in raw:
        raw["layout"] = "cid-pattern"
    return msgspec.convert(raw, Blueprint)


def seeded_rng(seed: int, c: Challenge) -> random.Random:
    knobs = ",".join(f"{k}={v}" for k, v in sorted(c.knobs.items()))
    return random.Random(f"{seed}/{c.cid}/{c.pattern_id}/{knobs}")


def materials(bp: Blueprint) -> list[tuple[Challenge, Material]]:
    """Each challenge's material, built from its pattern, knobs and the blueprint's seed (deterministic)."""
    out = []
    for c in bp.challenges:
        p = get_pattern(c.pattern_id)
        out.append((c, p.build(p.make_config(c.knobs), seeded_rng(bp.seed, c), bp.folder(c), c.cid)))
    return out


def fill_contract(bp: Blueprint) -> Blueprint:
    """The blueprint with its facts, derivations, boundary and acceptance criteria derived from its challenges."""
    facts: dict[str, Any] = {}
    derivations: list[str] = []
    given: list[str] = []
    discover: list[str] = []
    infer: list[str] = []
    acceptance: list[RubricItem] = []
    for c, m in materials(bp):
        facts.update({f"{c.cid}.{k}": v for k, v in m.facts.items()})
        derivations += [f"{c.cid}: {d}" for d in m.derivations]
        given += [f"{c.cid}: {g}" for g in m.given]
        discover += [f"{c.cid}: {d}" for d in m.discover]
        infer += [f"{c.cid}: {i}" for i in m.infer]
        acceptance += m.rubric
    return msgspec.structs.replace(
        bp,
        facts=facts,
        derivations=derivations,
        boundary=Boundary(given=given, discover=discover, infer=infer),
        acceptance=acceptance,
    )
