"""Skill2Env: agent skills into executable tasks with tunable difficulty, and the hardening loop."""

__all__: list[str] = []
