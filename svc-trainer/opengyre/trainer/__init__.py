"""QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, two backends, weight publishing, SFT."""

from ._admission import Admission, AdmissionPolicy, ExecutionOutcome, GroupAdmission, classify_outcome
from ._evaluator import (
    Evaluation,
    Evaluator,
    HarborVerifier,
    RewardFileEmptyError,
    RewardFileError,
    RewardFileNotFoundError,
    read_reward,
)
from ._failures import INFRA_CLASSES, TRANSIENT_CLASSES, classify_failure
from ._packing import PAD_ID, MicroBatch, pack_samples
from ._projection import TrainerProjection, TrajectoryRejected
from ._samples import SampleError, TrainingSample, execution_samples
from ._sampling import ROLE_PRIORITY, PathSampler, SampledPath, unmasked_trainable
from ._scoring import score_execution
from ._step import Learner, MicroResult, StepResult
from ._store import ReadyGroup, TrainerStore

__all__ = [
    "INFRA_CLASSES",
    "PAD_ID",
    "ROLE_PRIORITY",
    "TRANSIENT_CLASSES",
    "Admission",
    "AdmissionPolicy",
    "Evaluation",
    "Evaluator",
    "ExecutionOutcome",
    "GroupAdmission",
    "HarborVerifier",
    "Learner",
    "MicroBatch",
    "MicroResult",
    "PathSampler",
    "ReadyGroup",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "SampleError",
    "SampledPath",
    "StepResult",
    "TrainerProjection",
    "TrainerStore",
    "TrainingSample",
    "TrajectoryRejected",
    "classify_failure",
    "classify_outcome",
    "execution_samples",
    "pack_samples",
    "read_reward",
    "score_execution",
    "unmasked_trainable",
]
