"""Blueprints the synth tests share."""

from __future__ import annotations

from opengyre.synth import Blueprint, Challenge, fill_contract


def sparse_and_distributed(sources: int = 4) -> Blueprint:
    """Two challenges: one log with look-alikes (sparse-signal), one record split over ``sources`` files."""
    return fill_contract(
        Blueprint(
            task_id="t",
            version=1,
            skill_id="s",
            skill_name="s",
            goal="g",
            seed=1,
            capabilities={},
            challenges=[
                Challenge(cid="c0", pattern_id="sparse-signal", knobs={"distractors": 4}),
                Challenge(cid="c1", pattern_id="distributed-evidence", knobs={"sources": sources}),
            ],
        )
    )
