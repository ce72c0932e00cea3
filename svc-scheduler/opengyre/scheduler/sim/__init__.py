"""The discrete-event simulator: the real policies, command checks and state fold on a simulated clock."""

from ._compare import SPLIT_POLICIES, PolicyRun, best_split, comparable, parse_spec, run_spec, split_candidates
from ._config import ClusterConfig, CostConfig, SimConfig
from ._costs import GpuFacts, ModelFacts, MoveCost, MoveMode
from ._engine import EPOCH, SimulationStalled, Simulator, simulate
from ._facts import QWEN36_122B
from ._plot import plot_utilisation
from ._queue import EventQueue
from ._result import IdealBound, SimResult, StepRecord, TrainedWork, Usage, ideal_bound
from ._slots import Slots
from ._workload import (
    NL2REPO_122B,
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
    "NL2REPO_122B",
    "QWEN36_122B",
    "SPLIT_POLICIES",
    "Calibration",
    "ClusterConfig",
    "CostConfig",
    "DurationModel",
    "Durations",
    "EmpiricalDurations",
    "EventQueue",
    "GpuFacts",
    "GroupDurations",
    "IdealBound",
    "ModelFacts",
    "MoveCost",
    "MoveMode",
    "PolicyRun",
    "SimConfig",
    "SimResult",
    "SimulationStalled",
    "Simulator",
    "Slots",
    "StepRecord",
    "TrainedWork",
    "Usage",
    "WorkloadStats",
    "best_split",
    "calibrate",
    "comparable",
    "ideal_bound",
    "measure",
    "parse_spec",
    "plot_utilisation",
    "run_spec",
    "simulate",
    "split_candidates",
]
