"""Difficulty patterns: a capability challenge with control knobs, built from a seed into workspace material.

A pattern is one small module in ``_patterns/`` registered with ``@register``: a typed msgspec config whose
fields are the knobs, the knobs' levels (ascending difficulty), a seeded construction of workspace files, the
rubric items that check the solver's work, a reference-solution fragment, and ``measure``: the workspace's
observable that the knob drives (sources, depth, distractors, ...), so a test can see a higher level change it.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar

import msgspec

__all__ = [
    "DIMENSIONS",
    "Dimension",
    "Material",
    "Pattern",
    "Precondition",
    "RubricItem",
    "register",
    "registered",
]

Dimension = Literal["environment-understanding", "planning", "skill-use", "long-horizon-consistency", "error-recovery"]
DIMENSIONS: tuple[Dimension, ...] = (
    "environment-understanding",
    "planning",
    "skill-use",
    "long-horizon-consistency",
    "error-recovery",
)

RubricKind = Literal["json_equals", "json_constraint", "text_equals", "command", "judge"]


class RubricItem(msgspec.Struct, frozen=True, kw_only=True):
    """One weighted check. Programmatic kinds are graded by ``tests/grade.py``; ``judge`` items need an LLM judge
    and are reported as unjudged (left out of the reward) when none is configured."""

    id: str
    challenge: str
    weight: float
    kind: RubricKind
    file: str = ""  # workspace-relative path (json_equals, text_equals)
    key: str = ""  # json_equals: the answer object's key
    expected: Any = None  # the value the check wants (under tests/ only: the solver never sees it)
    # json_constraint: sum(coef[i] * answer[vars[i]]) <op> rhs, every answer value an int in [lo, hi]
    constraint: dict[str, Any] = msgspec.field(default_factory=dict)
    argv: list[str] = msgspec.field(default_factory=list)  # command: run in the workspace
    expect_stdout: str | None = None  # command: stripped stdout must equal this
    criterion: str = ""  # judge: what the judge scores, with partial credit


class Precondition(msgspec.Struct, frozen=True, kw_only=True):
    """A fact about the initial workspace, checked in the sandbox before a task is accepted."""

    what: str
    argv: list[str]
    expect_exit: Literal["zero", "nonzero"]


@dataclass
class Material:
    """What one pattern instance contributes to a task."""

    files: dict[str, bytes]
    instruction: str
    facts: dict[str, Any]
    rubric: list[RubricItem]
    solution: str  # python source run by solve.sh in the workspace (cwd), with ``json`` and ``os`` imported
    given: list[str] = field(default_factory=list)  # information boundary: what the instruction states
    discover: list[str] = field(default_factory=list)  # what the solver must find in the workspace
    infer: list[str] = field(default_factory=list)  # what it must derive
    derivations: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)  # workspace paths a faithful solver reads (diagnosis)
    preconditions: list[Precondition] = field(default_factory=list)
    executables: set[str] = field(default_factory=set)
    bins: tuple[str, ...] = ("bash", "python3")


C = TypeVar("C", bound=msgspec.Struct)


class Pattern(ABC):
    """Subclasses set the class attributes and implement ``build`` and ``measure``."""

    id: ClassVar[str]
    dimension: ClassVar[Dimension]
    summary: ClassVar[str]  # for authors (the catalogue, the synthesis model); may name the trick
    # What the solver is asked to do, as a task's goal line puts it ("total a table by group"): lower case, no
    # hint at the difficulty (the summary's decoys and traps stay out of the instruction).
    goal: ClassVar[str]
    config: ClassVar[type[msgspec.Struct]]
    knobs: ClassVar[dict[str, tuple[int, ...]]]  # knob -> its levels, easiest first
    primary: ClassVar[str]  # the knob ``measure`` observes and hardening raises first
    # Skill domains the pattern suits (empty: any); the synthesiser picks compatible patterns by these.
    domains: ClassVar[frozenset[str]] = frozenset()

    def make_config(self, knobs: Mapping[str, int]) -> msgspec.Struct:
        unknown = set(knobs) - set(self.knobs)
        if unknown:
            raise ValueError(f"pattern {self.id}: unknown knob(s) {sorted(unknown)}; it has {sorted(self.knobs)}")
        for name, value in knobs.items():
            if value not in self.knobs[name]:
                raise ValueError(f"pattern {self.id}: knob {name}={value} is not a level {self.knobs[name]}")
        values = {name: knobs.get(name, levels[0]) for name, levels in self.knobs.items()}
        return msgspec.convert(values, self.config)

    def level(self, name: str, index: int) -> int:
        return self.knobs[name][index]

    @abstractmethod
    def build(self, cfg: Any, rng: random.Random, ns: str, cid: str) -> Material:
        """Workspace material under ``ns/`` (a folder of its own), answers under ``answers/<cid>.json``."""

    @abstractmethod
    def measure(self, files: Mapping[str, bytes], facts: Mapping[str, Any], ns: str) -> float:
        """The observable the primary knob drives, computed from the built files (and the facts to find in them)."""


_REGISTRY: dict[str, Pattern] = {}
P = TypeVar("P", bound=type[Pattern])


def register(cls: P) -> P:
    if cls.id in _REGISTRY:
        raise ValueError(f"pattern {cls.id} registered twice")
    if cls.primary not in cls.knobs or any(list(v) != sorted(set(v)) for v in cls.knobs.values()):
        raise ValueError(f"pattern {cls.id}: knob levels must ascend and include the primary knob")
    goal = getattr(cls, "goal", "")
    if not goal or goal != goal.strip() or not goal[0].islower() or goal.endswith("."):
        raise ValueError(f"pattern {cls.id}: its goal must be a lower-case phrase without a final stop: {goal!r}")
    _REGISTRY[cls.id] = cls()
    return cls


def registered() -> Mapping[str, Pattern]:
    """The patterns registered so far, by id (``_catalogue`` imports every pattern module before it reads this)."""
    return _REGISTRY


def answer_path(cid: str) -> str:
    return f"answers/{cid}.json"


def answer_items(cid: str, facts: Mapping[str, Any], weight: float = 1.0) -> list[RubricItem]:
    """One json_equals item per answer key: partial credit per fact."""
    per = weight / max(len(facts), 1)
    return [
        RubricItem(
            id=f"{cid}.{k}", challenge=cid, weight=per, kind="json_equals", file=answer_path(cid), key=k, expected=v
        )
        for k, v in facts.items()
    ]


def write_answer_py(cid: str, expr: str) -> str:
    """Solution fragment: write the dict ``expr`` evaluates to as the challenge's answer."""
    return f"os.makedirs('answers', exist_ok=True)\njson.dump({expr}, open({answer_path(cid)!r}, 'w'))\n"


Builder = Callable[..., Material]
