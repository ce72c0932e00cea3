"""AgentPerfBench: agentic workload profiles, saturation sweeps, roofline."""

from ._hardware import HARDWARE, Hardware, hardware
from ._load import LoadConfig, RequestResult, RunResult, run_load
from ._metrics import Slo, cross_check_tokens, percentiles, summarise
from ._profiles import (
    PAPER_PROFILES,
    LengthDist,
    Profile,
    ProfileError,
    TraceSession,
    TraceTurn,
    fit_profile,
    paper_profile,
)
from ._roofline import (
    COMPONENTS,
    Capacity,
    ComponentCost,
    ConfigError,
    ModelShape,
    PhaseRoofline,
    capacity,
    phase_roofline,
    roofline_report,
)
from ._sweep import SweepPoint, SweepResult, find_saturation, steady_throughput, sweep
from ._traces import calls_sessions, read_trace, trace_formats
from ._workload import SessionPlan, TokenFill, TurnPlan, replay_sessions, shadow_sessions, synthesise_sessions

__all__ = [
    "COMPONENTS",
    "HARDWARE",
    "PAPER_PROFILES",
    "Capacity",
    "ComponentCost",
    "ConfigError",
    "Hardware",
    "LengthDist",
    "LoadConfig",
    "ModelShape",
    "PhaseRoofline",
    "Profile",
    "ProfileError",
    "RequestResult",
    "RunResult",
    "SessionPlan",
    "Slo",
    "SweepPoint",
    "SweepResult",
    "TokenFill",
    "TraceSession",
    "TraceTurn",
    "TurnPlan",
    "calls_sessions",
    "capacity",
    "cross_check_tokens",
    "find_saturation",
    "fit_profile",
    "hardware",
    "paper_profile",
    "percentiles",
    "phase_roofline",
    "read_trace",
    "replay_sessions",
    "roofline_report",
    "run_load",
    "shadow_sessions",
    "steady_throughput",
    "summarise",
    "sweep",
    "synthesise_sessions",
    "trace_formats",
]
