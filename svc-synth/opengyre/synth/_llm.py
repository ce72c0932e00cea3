"""LLM synthesis mode: a synthesis model behind any OpenAI-compatible endpoint drafts the blueprint (goal, the
compatible patterns and their knob levels) from the skill text and the pattern catalogue. The draft is the same
``Blueprint`` type as the procedural mode's and goes through the same gates; a draft that names an unknown
pattern, knob or level is refused with the reason (never repaired silently)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._blueprint import Blueprint, Challenge, fill_contract
from ._catalogue import get_pattern, pattern_ids
from ._synth import task_id_for

if TYPE_CHECKING:
    from openai import OpenAI

__all__ = ["LlmConfig", "LlmDraftError", "draft_blueprint_llm"]


class LlmDraftError(ValueError):
    """The synthesis model's draft is not a usable blueprint (the reason says why)."""


@dataclass(frozen=True)
class LlmConfig:
    base_url: str
    model: str
    api_key: str = "unused"
    timeout_s: float = 120.0

    @classmethod
    def from_env(cls) -> LlmConfig | None:
        """``OPENGYRE_SYNTH_LLM_URL`` and ``_MODEL`` (both, or neither: procedural mode), optional ``_KEY``."""
        url, model = os.environ.get("OPENGYRE_SYNTH_LLM_URL"), os.environ.get("OPENGYRE_SYNTH_LLM_MODEL")
        if not url and not model:
            return None
        if not url or not model:
            raise ValueError("set both OPENGYRE_SYNTH_LLM_URL and OPENGYRE_SYNTH_LLM_MODEL, or neither")
        return cls(url, model, os.environ.get("OPENGYRE_SYNTH_LLM_KEY", "unused"))

    def client(self, *, max_retries: int) -> OpenAI:
        """The official client for this endpoint (imported here: ~0.5 s, only where a synthesis model is set)."""
        from openai import OpenAI

        return OpenAI(base_url=self.base_url, api_key=self.api_key, timeout=self.timeout_s, max_retries=max_retries)


def _catalogue() -> str:
    lines = []
    for pid in pattern_ids():
        p = get_pattern(pid)
        knobs = "; ".join(f"{k} in {list(v)}" for k, v in p.knobs.items())
        domains = ", ".join(sorted(p.domains)) or "any"
        lines.append(f"- {pid} [{p.dimension}; domains: {domains}] {p.summary}. knobs: {knobs}")
    return "\n".join(lines)


_SYSTEM = """You design agent tasks from a skill. Pick {n} difficulty patterns from the catalogue that suit the skill
(different patterns, favouring those whose domains include the skill's and the capability dimensions the skill
demands), choose a level for each knob, and
state the task's goal in one sentence. Answer with JSON only:
{{"goal": "...", "challenges": [{{"pattern_id": "...", "knobs": {{"<knob>": <level>}}}}]}}

Catalogue:
{catalogue}"""


def draft_blueprint_llm(
    cfg: LlmConfig,
    *,
    skill_id: str,
    skill_name: str,
    description: str,
    body: str,
    capabilities: dict[str, float],
    seed: int,
    n_challenges: int = 2,
    domain: str = "",
) -> Blueprint:
    resp = cfg.client(max_retries=2).chat.completions.create(
        model=cfg.model,
        messages=[
            {"role": "system", "content": _SYSTEM.format(n=n_challenges, catalogue=_catalogue())},
            {
                "role": "user",
                "content": f"Skill {skill_name} (domain: {domain or 'none'}): {description}\n\n{body}\n\n"
                f"Demand: {capabilities}",
            },
        ],
        response_format={"type": "json_object"},
        temperature=0.0,
        seed=seed,
    )
    text = resp.choices[0].message.content or ""
    try:
        draft: Any = json.loads(text)
        goal = draft["goal"]
        raw = draft["challenges"]
        if not isinstance(goal, str) or not goal.strip() or not isinstance(raw, list) or not raw:
            raise TypeError("goal must be a non-empty string and challenges a non-empty list")
        challenges = [
            Challenge(
                cid=f"c{i}", pattern_id=str(c["pattern_id"]), knobs={str(k): int(v) for k, v in c["knobs"].items()}
            )
            for i, c in enumerate(raw)
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise LlmDraftError(f"the synthesis model's draft is not a blueprint ({exc}): {text[:300]!r}") from None
    bp = Blueprint(
        task_id=task_id_for(skill_name, seed, domain=domain),
        version=1,
        skill_id=skill_id,
        skill_name=skill_name,
        goal=goal.strip(),
        seed=seed,
        capabilities=dict(capabilities),
        challenges=challenges,
        origin="llm",
        domain=domain,
    )
    try:
        bp.validate()
    except (ValueError, KeyError) as exc:
        raise LlmDraftError(f"the synthesis model's draft is refused: {exc}") from None
    if len({c.pattern_id for c in challenges}) != len(challenges):
        raise LlmDraftError("the synthesis model's draft repeats a pattern")
    return fill_contract(bp)
