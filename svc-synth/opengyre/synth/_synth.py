"""Procedural synthesis: a skill's capability requirements pick compatible patterns, knobs set their strength,
and a seed makes the blueprint (and so the task) reproducible byte for byte."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from ._blueprint import Blueprint, Challenge, fill_contract
from ._catalogue import get_pattern, pattern_ids
from ._pattern import DIMENSIONS

__all__ = ["check_choice", "draft_blueprint", "draw_patterns", "parse_knobs", "procedural_goal", "task_id_for"]


def task_id_for(skill_name: str, seed: int, level: int = 0, choice: str = "", domain: str = "") -> str:
    """``<skill>-l<level>-<hash>``: the level is part of the id (and ``choice``, the fixed patterns and knobs, of
    the hash), so one store holds a task per seed, level and choice instead of refusing the second build. A
    ``domain`` (a task drawn for its skill's domain, shipping the skill) is in the hash too: a store holding tasks
    built before grounding builds the grounded ones beside them, under other ids."""
    key = f"{skill_name}/{seed}" + (f"/l{level}" if level else "") + (f"/{choice}" if choice else "")
    key += f"/d:{domain}" if domain else ""
    return f"{skill_name}-l{level}-{hashlib.sha256(key.encode()).hexdigest()[:8]}"


def parse_knobs(specs: Sequence[str]) -> dict[str, int]:
    """``PATTERN.KNOB=LEVEL`` or ``KNOB=LEVEL`` (every chosen pattern with that knob) into a mapping; a malformed
    spec is a ``ValueError`` saying which."""
    out: dict[str, int] = {}
    for spec in specs:
        name, eq, value = spec.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            out[name.strip()] = int(value)
        except ValueError:
            raise ValueError(f"knob {spec!r} is not KNOB=LEVEL or PATTERN.KNOB=LEVEL (LEVEL an integer)") from None
    return out


def check_choice(patterns: Sequence[str], knobs: Mapping[str, int]) -> None:
    """A fixed choice of patterns and knob levels, checked before anything is built: a ``ValueError`` names an
    unknown or repeated pattern, knobs without patterns (drawn patterns differ per task), a knob no chosen
    pattern has, or a level that is not one of the knob's."""
    for pid in patterns:
        try:
            get_pattern(pid)
        except KeyError as exc:
            raise ValueError(exc.args[0]) from None
    if len(set(patterns)) != len(patterns):
        raise ValueError(f"a pattern is chosen twice: {list(patterns)}")
    if knobs and not patterns:
        raise ValueError("knobs need patterns chosen with them: drawn patterns differ from task to task")
    for name, value in knobs.items():
        owner, _, knob = name.rpartition(".")
        having = [get_pattern(pid) for pid in patterns if (owner or pid) == pid and knob in get_pattern(pid).knobs]
        if not having:
            raise ValueError(f"knob {name!r}: no chosen pattern ({', '.join(patterns)}) has it")
        for p in having:
            if value not in p.knobs[knob]:
                raise ValueError(f"knob {name}={value}: {p.id}'s {knob} levels are {list(p.knobs[knob])}")


def procedural_goal(skill_name: str, patterns: Sequence[str]) -> str:
    """A task's goal line in the procedural mode, from its patterns' own phrasing in order ("Total a table by group
    and count error codes in service logs, with the csv-report skill"): written per task, no hint at the
    difficulty (each pattern's ``goal``)."""
    goals = [get_pattern(pid).goal for pid in patterns]
    said = goals[0] if len(goals) == 1 else ", ".join(goals[:-1]) + " and " + goals[-1]
    return f"{said[0].upper()}{said[1:]}, with the {skill_name} skill"


def draw_patterns(rng: random.Random, capabilities: Mapping[str, float], domain: str, n: int) -> list[str]:
    """``n`` distinct patterns for a skill: those that declare its ``domain`` first, then the domain-free ones, then
    any (a skill of a domain no pattern declares, or more challenges than fit it); within each pool a dimension is
    drawn by the skill's demand on it (its capability profile) among the pool's dimensions, then a pattern of it.
    A skill without a domain draws from every pattern."""
    fits = [pid for pid in pattern_ids() if domain in get_pattern(pid).domains] if domain else []
    free = [pid for pid in pattern_ids() if not get_pattern(pid).domains] if domain else []
    weight = {d: max(capabilities.get(d, 0.1), 0.01) for d in DIMENSIONS}
    chosen: list[str] = []
    for pool in (fits, free, pattern_ids()):
        while len(chosen) < n:
            left = [pid for pid in pool if pid not in chosen]
            if not left:
                break
            dims = [d for d in DIMENSIONS if any(get_pattern(pid).dimension == d for pid in left)]
            dim = rng.choices(dims, [weight[d] for d in dims])[0]
            chosen.append(rng.choice([pid for pid in left if get_pattern(pid).dimension == dim]))
    if len(chosen) < n:
        raise ValueError(f"{n} challenges asked for; there are {len(chosen)} patterns")
    return chosen


def _knobs_for(
    pid: str, levels: Mapping[str, tuple[int, ...]], level: int, overrides: Mapping[str, int]
) -> dict[str, int]:
    knobs = {k: v[min(level, len(v) - 1)] for k, v in levels.items()}
    for name, value in overrides.items():
        owner, _, knob = name.rpartition(".")
        if (owner or pid) == pid and knob in knobs:
            knobs[knob] = value
    return knobs


def draft_blueprint(
    *,
    skill_id: str,
    skill_name: str,
    capabilities: Mapping[str, float],
    seed: int,
    n_challenges: int = 2,
    level: int = 0,
    patterns: Sequence[str] | None = None,
    knobs: Mapping[str, int] | None = None,
    domain: str = "",
) -> Blueprint:
    """Challenges drawn for the skill's ``domain`` by its demand per dimension (``draw_patterns``), knobs at ``level``
    (clamped to each knob's levels); ``patterns`` fixes the choice instead, ``knobs`` sets single knobs
    (``KNOB`` or ``PATTERN.KNOB`` to a level of that knob). A pattern, knob or level that does not exist, or a knob
    no chosen pattern has, is a ``ValueError`` naming it."""
    rng = random.Random(f"{skill_id}/{seed}")
    chosen: list[str] = list(patterns or ())
    overrides = dict(knobs or {})
    check_choice(chosen, overrides)
    if not chosen:
        chosen = draw_patterns(rng, capabilities, domain, n_challenges)
    challenges = []
    for i, pid in enumerate(chosen):
        p = get_pattern(pid)
        challenges.append(Challenge(cid=f"c{i}", pattern_id=pid, knobs=_knobs_for(pid, p.knobs, level, overrides)))
    choice = ""
    if patterns or overrides:
        choice = ",".join(chosen) + "|" + ",".join(f"{k}={v}" for k, v in sorted(overrides.items()))
    bp = Blueprint(
        task_id=task_id_for(skill_name, seed, level, choice, domain),
        version=1,
        skill_id=skill_id,
        skill_name=skill_name,
        goal=procedural_goal(skill_name, chosen),
        seed=seed,
        capabilities=dict(capabilities),
        challenges=challenges,
        domain=domain,
    )
    bp.validate()
    return fill_contract(bp)
