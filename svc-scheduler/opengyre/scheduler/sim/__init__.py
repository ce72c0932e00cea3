"""The discrete-event simulator: the real policies, command checks and state fold on a simulated clock."""

from ._compare import SPLIT_POLICIES, PolicyRun, best_split, comparable, parse_spec, run_spec, split_candidates
from ._config import ClusterConfig, CostConfig, SimConfig
from ._costs import MOVE_MODES, GpuFacts, ModelFacts, MoveCost, MoveMode
from ._derive import DerivedKnobs, derive_knobs
from ._engine import EPOCH, SimulationStalled, Simulator, at_seconds, simulate
from ._facts import NL2REPO_122B, NL2REPO_122B_RUN, QWEN36_122B
from ._files import (
    FixedKnobs,
    PublishedRun,
    WorkloadFile,
    WorkloadFileError,
    dump_workload,
    load_workload,
    shipped_workload,
)
from ._fit import StoreSample, fit_workload, read_store
from ._measured import MeasuredMoves, load_measured
from ._plot import plot_sensitivity, plot_utilisation
from ._queue import EventQueue
from ._result import IdealBound, SimResult, StepRecord, TrainedWork, Usage, feasible_lag, ideal_bound
from ._setup import Setup, setup
from ._slots import Slots
from ._workload import (
    Calibration,
    DurationModel,
    Durations,
    EmpiricalDurations,
    GroupDurations,
    WorkloadStats,
    calibrate,
    measure,
)

__all__ = [
    "EPOCH",
    "MOVE_MODES",
    "NL2REPO_122B",
    "NL2REPO_122B_RUN",
    "QWEN36_122B",
    "SPLIT_POLICIES",
    "Calibration",
    "ClusterConfig",
    "CostConfig",
    "DerivedKnobs",
    "DurationModel",
    "Durations",
    "EmpiricalDurations",
    "EventQueue",
    "FixedKnobs",
    "GpuFacts",
    "GroupDurations",
    "IdealBound",
    "MeasuredMoves",
    "ModelFacts",
    "MoveCost",
    "MoveMode",
    "PolicyRun",
    "PublishedRun",
    "Setup",
    "SimConfig",
    "SimResult",
    "SimulationStalled",
    "Simulator",
    "Slots",
    "StepRecord",
    "StoreSample",
    "TrainedWork",
    "Usage",
    "WorkloadFile",
    "WorkloadFileError",
    "WorkloadStats",
    "at_seconds",
    "best_split",
    "calibrate",
    "comparable",
    "derive_knobs",
    "dump_workload",
    "feasible_lag",
    "fit_workload",
    "ideal_bound",
    "load_measured",
    "load_workload",
    "measure",
    "parse_spec",
    "plot_sensitivity",
    "plot_utilisation",
    "read_store",
    "run_spec",
    "setup",
    "shipped_workload",
    "simulate",
    "split_candidates",
]
