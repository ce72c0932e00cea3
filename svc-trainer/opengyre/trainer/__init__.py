"""QwenGyre trainer: partial scoring, bounded sampling, GRPO/GSPO, two backends, weight publishing, SFT.

Names load on first use (PEP 562): the CLI and the service's projection import this package without
paying for torch; the training pieces pull it in when they are touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._admission import (
        Admission,
        AdmissionPolicy,
        ExecutionOutcome,
        GroupAdmission,
        GroupInput,
        StepAdmission,
        classify_outcome,
    )
    from ._cell_process import (
        CellHub,
        ProcessSatellite,
    )
    from ._cell_roles import (
        RoleCells,
    )
    from ._config import (
        TrainerConfig,
    )
    from ._cost import (
        SampleCost,
        sample_cost,
    )
    from ._failures import (
        AGENT_CLASSES,
        INFRA_CLASSES,
        REPORTABLE_CLASSES,
        TRANSIENT_CLASSES,
        classify_failure,
    )
    from ._loop import (
        OnlineTrainer,
        StepReport,
    )
    from ._minibatch import (
        plan_minibatches,
    )
    from ._packing import (
        PAD_ID,
        MicroBatch,
        pack_samples,
    )
    from ._prepare import (
        PreparedStep,
        prepare_step,
    )
    from ._projection import (
        TrainerProjection,
        TrajectoryRejected,
    )
    from ._publish import (
        EngineReload,
        PublishedCheckpoint,
        engine_versions,
        export_checkpoint,
        reload_engines,
        weight_version,
        write_checkpoint,
    )
    from ._retention import (
        Compactable,
        RetentionPolicy,
        compact,
        compactable,
        retention_loop,
    )
    from ._samples import (
        LOSS_AGGREGATIONS,
        SampleError,
        TrainingSample,
        execution_samples,
        execution_weight,
        loss_normaliser,
    )
    from ._sampling import (
        ROLE_PRIORITY,
        PathSampler,
        SampledPath,
        unmasked_trainable,
    )
    from ._schedule import (
        lr_at,
    )
    from ._scoring import (
        score_execution,
    )
    from ._sft import (
        DEFAULT_SFT_LR,
        PRETRAINED_SFT_LR,
        Conversation,
        SftRun,
        golden_from_task,
        golden_tree,
        read_conversations,
        run_sft,
        sft_samples,
        sft_samples_from_messages,
        sft_trees_from_messages,
        sft_warm_start,
    )
    from ._staleness import (
        Staleness,
        staleness,
    )
    from ._step import (
        Learner,
        MicroResult,
        MiniBatch,
        Proximal,
        StepResult,
    )
    from ._store import (
        ReadyGroup,
        TrainerStore,
    )
    from ._streaming import (
        Cell,
        MicroStepBuffer,
        Satellite,
        StepFinished,
        StreamingStep,
        snapshot_digest,
        streaming_step,
    )
    from ._synthetic import (
        TreeShape,
        agentic_tree,
    )

_WHERE: dict[str, str] = {
    "AGENT_CLASSES": "._failures",
    "REPORTABLE_CLASSES": "._failures",
    "GroupInput": "._admission",
    "StepAdmission": "._admission",
    "MiniBatch": "._step",
    "Proximal": "._step",
    "plan_minibatches": "._minibatch",
    "loss_normaliser": "._samples",
    "execution_weight": "._samples",
    "LOSS_AGGREGATIONS": "._samples",
    "lr_at": "._schedule",
    "TreeShape": "._synthetic",
    "agentic_tree": "._synthetic",
    "Admission": "._admission",
    "Compactable": "._retention",
    "RetentionPolicy": "._retention",
    "compact": "._retention",
    "compactable": "._retention",
    "retention_loop": "._retention",
    "AdmissionPolicy": "._admission",
    "EngineReload": "._publish",
    "ExecutionOutcome": "._admission",
    "GroupAdmission": "._admission",
    "INFRA_CLASSES": "._failures",
    "Learner": "._step",
    "MicroBatch": "._packing",
    "MicroResult": "._step",
    "MicroStepBuffer": "._streaming",
    "Cell": "._streaming",
    "CellHub": "._cell_process",
    "ProcessSatellite": "._cell_process",
    "RoleCells": "._cell_roles",
    "StepFinished": "._streaming",
    "OnlineTrainer": "._loop",
    "PAD_ID": "._packing",
    "PathSampler": "._sampling",
    "PreparedStep": "._prepare",
    "PublishedCheckpoint": "._publish",
    "ROLE_PRIORITY": "._sampling",
    "ReadyGroup": "._store",
    "SampleCost": "._cost",
    "SampleError": "._samples",
    "SampledPath": "._sampling",
    "Satellite": "._streaming",
    "StreamingStep": "._streaming",
    "Staleness": "._staleness",
    "StepReport": "._loop",
    "StepResult": "._step",
    "TRANSIENT_CLASSES": "._failures",
    "TrainerConfig": "._config",
    "TrainerProjection": "._projection",
    "TrainerStore": "._store",
    "TrainingSample": "._samples",
    "TrajectoryRejected": "._projection",
    "classify_failure": "._failures",
    "classify_outcome": "._admission",
    "execution_samples": "._samples",
    "golden_from_task": "._sft",
    "golden_tree": "._sft",
    "pack_samples": "._packing",
    "prepare_step": "._prepare",
    "reload_engines": "._publish",
    "export_checkpoint": "._publish",
    "engine_versions": "._publish",
    "run_sft": "._sft",
    "sample_cost": "._cost",
    "score_execution": "._scoring",
    "sft_samples": "._sft",
    "Conversation": "._sft",
    "DEFAULT_SFT_LR": "._sft",
    "PRETRAINED_SFT_LR": "._sft",
    "SftRun": "._sft",
    "read_conversations": "._sft",
    "sft_samples_from_messages": "._sft",
    "sft_trees_from_messages": "._sft",
    "sft_warm_start": "._sft",
    "snapshot_digest": "._streaming",
    "staleness": "._staleness",
    "streaming_step": "._streaming",
    "unmasked_trainable": "._sampling",
    "weight_version": "._publish",
    "write_checkpoint": "._publish",
}

__all__ = [
    "AGENT_CLASSES",
    "DEFAULT_SFT_LR",
    "INFRA_CLASSES",
    "LOSS_AGGREGATIONS",
    "PAD_ID",
    "PRETRAINED_SFT_LR",
    "REPORTABLE_CLASSES",
    "ROLE_PRIORITY",
    "TRANSIENT_CLASSES",
    "Admission",
    "AdmissionPolicy",
    "Cell",
    "CellHub",
    "Compactable",
    "Conversation",
    "EngineReload",
    "ExecutionOutcome",
    "GroupAdmission",
    "GroupInput",
    "Learner",
    "MicroBatch",
    "MicroResult",
    "MicroStepBuffer",
    "MiniBatch",
    "OnlineTrainer",
    "PathSampler",
    "PreparedStep",
    "ProcessSatellite",
    "Proximal",
    "PublishedCheckpoint",
    "ReadyGroup",
    "RetentionPolicy",
    "RoleCells",
    "SampleCost",
    "SampleError",
    "SampledPath",
    "Satellite",
    "SftRun",
    "Staleness",
    "StepAdmission",
    "StepFinished",
    "StepReport",
    "StepResult",
    "StreamingStep",
    "TrainerConfig",
    "TrainerProjection",
    "TrainerStore",
    "TrainingSample",
    "TrajectoryRejected",
    "TreeShape",
    "agentic_tree",
    "classify_failure",
    "classify_outcome",
    "compact",
    "compactable",
    "engine_versions",
    "execution_samples",
    "execution_weight",
    "export_checkpoint",
    "golden_from_task",
    "golden_tree",
    "loss_normaliser",
    "lr_at",
    "pack_samples",
    "plan_minibatches",
    "prepare_step",
    "read_conversations",
    "reload_engines",
    "retention_loop",
    "run_sft",
    "sample_cost",
    "score_execution",
    "sft_samples",
    "sft_samples_from_messages",
    "sft_trees_from_messages",
    "sft_warm_start",
    "snapshot_digest",
    "staleness",
    "streaming_step",
    "unmasked_trainable",
    "weight_version",
    "write_checkpoint",
]


__getattr__ = lazy_exports(__name__, {k: v.lstrip(".") for k, v in _WHERE.items()})


def __dir__() -> list[str]:
    return sorted(__all__)
