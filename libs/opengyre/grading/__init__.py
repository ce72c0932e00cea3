"""Grading, shared by the services that score a workspace (issue 25: the shared domain, not a service's private
modules): the Harbor verifier run apart from the agent, its reward files, the defensive copy of a workspace, and
the LLM judge of a rubric's ``judge`` items.

The trainer scores executions with it; synth validates tasks with their reference solution through the same
verifier, so both grade alike without one service importing the other.
"""

from ._evaluator import (
    REWARD_LIMIT,
    Evaluation,
    Evaluator,
    HarborVerifier,
    RewardFileEmptyError,
    RewardFileError,
    RewardFileNotFoundError,
    read_diagnostics,
    read_reward,
)
from ._judge import (
    JUDGE_API_KEY_ENV,
    JUDGE_MODEL_ENV,
    JUDGE_URL_ENV,
    SCORES,
    Fence,
    JudgeConfig,
    JudgedVerifier,
    JudgeFailed,
    JudgeItem,
    JudgeVerdict,
    LLMJudge,
    evaluator_from_env,
    judge_items,
)
from ._workspace import CopyBounds, CopyReport, UnsafeFileError, WorkspaceTooLarge, copy_workspace, read_bounded

__all__ = [
    "JUDGE_API_KEY_ENV",
    "JUDGE_MODEL_ENV",
    "JUDGE_URL_ENV",
    "REWARD_LIMIT",
    "SCORES",
    "CopyBounds",
    "CopyReport",
    "Evaluation",
    "Evaluator",
    "Fence",
    "HarborVerifier",
    "JudgeConfig",
    "JudgeFailed",
    "JudgeItem",
    "JudgeVerdict",
    "JudgedVerifier",
    "LLMJudge",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "UnsafeFileError",
    "WorkspaceTooLarge",
    "copy_workspace",
    "evaluator_from_env",
    "judge_items",
    "read_bounded",
    "read_diagnostics",
    "read_reward",
]
