"""The discrete-event simulator: the real policies, command checks and state fold on a simulated clock."""

from ._config import ClusterConfig, CostConfig, SimConfig
from ._engine import EPOCH, Simulator, simulate
from ._plot import plot_utilisation
from ._result import IdealBound, Segment, SimResult, StepRecord, ideal_bound
from ._workload import NL2REPO_122B, Calibration, DurationModel, WorkloadStats, calibrate, measure

__all__ = [
    "EPOCH",
    "NL2REPO_122B",
    "Calibration",
    "ClusterConfig",
    "CostConfig",
    "DurationModel",
    "IdealBound",
    "Segment",
    "SimConfig",
    "SimResult",
    "Simulator",
    "StepRecord",
    "WorkloadStats",
    "calibrate",
    "ideal_bound",
    "measure",
    "plot_utilisation",
    "simulate",
]
