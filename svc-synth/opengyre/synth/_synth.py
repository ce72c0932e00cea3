"""Procedural synthesis: a skill's capability requirements pick compatible patterns, knobs set their strength,
and a seed makes the blueprint (and so the task) reproducible byte for byte."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Mapping, Sequence

from ._blueprint import Blueprint, Challenge, fill_contract
from ._pattern import DIMENSIONS, get_pattern, pattern_ids

__all__ = ["draft_blueprint", "task_id_for"]


def task_id_for(skill_name: str, seed: int) -> str:
    return f"{skill_name}-{hashlib.sha256(f'{skill_name}/{seed}'.encode()).hexdigest()[:8]}"


def draft_blueprint(
    *,
    skill_id: str,
    skill_name: str,
    description: str,
    capabilities: Mapping[str, float],
    seed: int,
    n_challenges: int = 2,
    level: int = 0,
    patterns: Sequence[str] | None = None,
) -> Blueprint:
    """Challenges drawn by the skill's demand per dimension (one pattern at most once), knobs at ``level``
    (clamped to each knob's levels); ``patterns`` fixes the choice instead."""
    rng = random.Random(f"{skill_id}/{seed}")
    chosen: list[str] = list(patterns or ())
    if not chosen:
        weights = [max(capabilities.get(d, 0.1), 0.01) for d in DIMENSIONS]
        while len(chosen) < n_challenges:
            dim = rng.choices(DIMENSIONS, weights)[0]
            pool = [p for p in pattern_ids(dim) if p not in chosen]
            if pool:
                chosen.append(rng.choice(pool))
    challenges = []
    for i, pid in enumerate(chosen):
        p = get_pattern(pid)
        knobs = {k: levels[min(level, len(levels) - 1)] for k, levels in p.knobs.items()}
        challenges.append(Challenge(cid=f"c{i}", pattern_id=pid, knobs=knobs))
    first = description.split(". ")[0].rstrip(".")
    bp = Blueprint(
        task_id=task_id_for(skill_name, seed),
        version=1,
        skill_id=skill_id,
        skill_name=skill_name,
        goal=f"Use the {skill_name} skill ({first}) on the workspace below",
        seed=seed,
        capabilities=dict(capabilities),
        challenges=challenges,
    )
    bp.validate()
    return fill_contract(bp)
