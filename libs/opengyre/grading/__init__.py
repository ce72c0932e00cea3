"""Grading, shared by the services that score a workspace (issue 25: the shared domain, not a service's private
modules): the Harbor verifier run apart from the agent, its reward files, and the defensive copy of a workspace.

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
from ._workspace import CopyBounds, CopyReport, UnsafeFileError, WorkspaceTooLarge, copy_workspace, read_bounded

__all__ = [
    "REWARD_LIMIT",
    "CopyBounds",
    "CopyReport",
    "Evaluation",
    "Evaluator",
    "HarborVerifier",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "UnsafeFileError",
    "WorkspaceTooLarge",
    "copy_workspace",
    "read_bounded",
    "read_diagnostics",
    "read_reward",
]
