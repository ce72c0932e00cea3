"""Skill2Env: agent skills into executable tasks with tunable difficulty, and the hardening loop."""

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
