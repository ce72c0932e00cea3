"""QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, two backends, weight publishing, SFT."""

from ._admission import Admission, AdmissionPolicy, ExecutionOutcome, GroupAdmission, classify_outcome
from ._config import TrainerConfig
from ._cost import SampleCost, sample_cost
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
from ._loop import OnlineTrainer, StepReport
from ._packing import PAD_ID, MicroBatch, pack_samples
from ._prepare import PreparedStep, prepare_step
from ._projection import TrainerProjection, TrajectoryRejected
from ._publish import EngineReload, PublishedCheckpoint, reload_engines, weight_version, write_checkpoint
from ._samples import SampleError, TrainingSample, execution_samples
from ._sampling import ROLE_PRIORITY, PathSampler, SampledPath, unmasked_trainable
from ._scoring import score_execution
from ._sft import golden_from_task, golden_tree, run_sft, sft_samples
from ._staleness import Staleness, staleness
from ._step import Learner, MicroResult, StepResult
from ._store import ReadyGroup, TrainerStore
from ._streaming import MicroStepBuffer, Satellite, snapshot_digest, streaming_step

__all__ = [
    "INFRA_CLASSES",
    "PAD_ID",
    "ROLE_PRIORITY",
    "TRANSIENT_CLASSES",
    "Admission",
    "AdmissionPolicy",
    "EngineReload",
    "Evaluation",
    "Evaluator",
    "ExecutionOutcome",
    "GroupAdmission",
    "HarborVerifier",
    "Learner",
    "MicroBatch",
    "MicroResult",
    "MicroStepBuffer",
    "OnlineTrainer",
    "PathSampler",
    "PreparedStep",
    "PublishedCheckpoint",
    "ReadyGroup",
    "RewardFileEmptyError",
    "RewardFileError",
    "RewardFileNotFoundError",
    "SampleCost",
    "SampleError",
    "SampledPath",
    "Satellite",
    "Staleness",
    "StepReport",
    "StepResult",
    "TrainerConfig",
    "TrainerProjection",
    "TrainerStore",
    "TrainingSample",
    "TrajectoryRejected",
    "classify_failure",
    "classify_outcome",
    "execution_samples",
    "golden_from_task",
    "golden_tree",
    "pack_samples",
    "prepare_step",
    "read_reward",
    "reload_engines",
    "run_sft",
    "sample_cost",
    "score_execution",
    "sft_samples",
    "snapshot_digest",
    "staleness",
    "streaming_step",
    "unmasked_trainable",
    "weight_version",
    "write_checkpoint",
]
