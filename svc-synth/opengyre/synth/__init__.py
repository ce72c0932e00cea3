"""Skill2Env: agent skills into executable tasks with tunable difficulty, and the hardening loop."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._blueprint import Blueprint, Boundary, Challenge, fill_contract, load_blueprint, materials
    from ._build import BuiltTask, build_task, skill_digests, task_skill_files, write_task
    from ._catalogue import get_pattern, pattern_ids
    from ._diagnose_llm import diagnose_llm, diagnosis_request
    from ._gates import GATES, GateLimits, Verdict, validate_task
    from ._grade import GRADER_SOURCE, TEST_SH
    from ._harbor import HarborTask, export_task, import_task
    from ._hardening import Diagnosis, HardeningProjection, coverage, diagnose, propose
    from ._llm import LlmConfig, LlmDraftError, draft_blueprint_llm
    from ._pattern import DIMENSIONS, Dimension, Material, Pattern, Precondition, RubricItem
    from ._pipeline import Synthesizer, TaskBuild
    from ._run import Outcome, RunLimits, run_solution
    from ._skills import (
        SUBSTRATE_BINS,
        IngestReport,
        Rejection,
        Skill,
        SkillLimits,
        derive_capabilities,
        ingest,
        read_skill_files,
    )
    from ._solver import ShortcutSolver, SolverRun
    from ._synth import check_choice, draft_blueprint, draw_patterns, parse_knobs, procedural_goal, task_id_for
    from ._tasks import TasksProjection, task_lineage

_WHERE: dict[str, str] = {
    "Blueprint": "_blueprint",
    "Boundary": "_blueprint",
    "Challenge": "_blueprint",
    "fill_contract": "_blueprint",
    "load_blueprint": "_blueprint",
    "materials": "_blueprint",
    "BuiltTask": "_build",
    "build_task": "_build",
    "skill_digests": "_build",
    "task_skill_files": "_build",
    "write_task": "_build",
    "get_pattern": "_catalogue",
    "pattern_ids": "_catalogue",
    "diagnose_llm": "_diagnose_llm",
    "diagnosis_request": "_diagnose_llm",
    "GATES": "_gates",
    "GateLimits": "_gates",
    "Verdict": "_gates",
    "validate_task": "_gates",
    "GRADER_SOURCE": "_grade",
    "TEST_SH": "_grade",
    "HarborTask": "_harbor",
    "export_task": "_harbor",
    "import_task": "_harbor",
    "Diagnosis": "_hardening",
    "HardeningProjection": "_hardening",
    "coverage": "_hardening",
    "diagnose": "_hardening",
    "propose": "_hardening",
    "LlmConfig": "_llm",
    "LlmDraftError": "_llm",
    "draft_blueprint_llm": "_llm",
    "DIMENSIONS": "_pattern",
    "Dimension": "_pattern",
    "Material": "_pattern",
    "Pattern": "_pattern",
    "Precondition": "_pattern",
    "RubricItem": "_pattern",
    "Synthesizer": "_pipeline",
    "TaskBuild": "_pipeline",
    "Outcome": "_run",
    "RunLimits": "_run",
    "run_solution": "_run",
    "SUBSTRATE_BINS": "_skills",
    "IngestReport": "_skills",
    "Rejection": "_skills",
    "Skill": "_skills",
    "SkillLimits": "_skills",
    "derive_capabilities": "_skills",
    "ingest": "_skills",
    "read_skill_files": "_skills",
    "ShortcutSolver": "_solver",
    "SolverRun": "_solver",
    "check_choice": "_synth",
    "draft_blueprint": "_synth",
    "draw_patterns": "_synth",
    "parse_knobs": "_synth",
    "procedural_goal": "_synth",
    "task_id_for": "_synth",
    "TasksProjection": "_tasks",
    "task_lineage": "_tasks",
}

__all__ = [
    "DIMENSIONS",
    "GATES",
    "GRADER_SOURCE",
    "SUBSTRATE_BINS",
    "TEST_SH",
    "Blueprint",
    "Boundary",
    "BuiltTask",
    "Challenge",
    "Diagnosis",
    "Dimension",
    "GateLimits",
    "HarborTask",
    "HardeningProjection",
    "IngestReport",
    "LlmConfig",
    "LlmDraftError",
    "Material",
    "Outcome",
    "Pattern",
    "Precondition",
    "Rejection",
    "RubricItem",
    "RunLimits",
    "ShortcutSolver",
    "Skill",
    "SkillLimits",
    "SolverRun",
    "Synthesizer",
    "TaskBuild",
    "TasksProjection",
    "Verdict",
    "build_task",
    "check_choice",
    "coverage",
    "derive_capabilities",
    "diagnose",
    "diagnose_llm",
    "diagnosis_request",
    "draft_blueprint",
    "draft_blueprint_llm",
    "draw_patterns",
    "export_task",
    "fill_contract",
    "get_pattern",
    "import_task",
    "ingest",
    "load_blueprint",
    "materials",
    "parse_knobs",
    "pattern_ids",
    "procedural_goal",
    "propose",
    "read_skill_files",
    "run_solution",
    "skill_digests",
    "task_id_for",
    "task_lineage",
    "task_skill_files",
    "validate_task",
    "write_task",
]


# Names load on first use (PEP 562): `opengyre.cli` imports this package on every process start to register
# its commands, which then paid for the whole pipeline (bench/import_cost.py, docs/benchmarks.md).
__getattr__ = lazy_exports(__name__, _WHERE)
