"""Actuators: how a cell's machines change role. One interface; external (events only), local (CPU engine and
trainer worker processes) and SGLang + Megatron (GPU nodes) behind it."""

from ._base import Actuator, ActuatorError
from ._drain import Drainer, NoDrainer
from ._external import ExternalActuator
from ._local import DEFAULT_ENGINE_ARGV, DEFAULT_TRAINER_ARGV, LocalActuator
from ._process import ChildProcess, ChildProcesses
from ._proxy import ProxyDrainer
from ._sglang import LatestWeights, SglangMegatronActuator

__all__ = [
    "DEFAULT_ENGINE_ARGV",
    "DEFAULT_TRAINER_ARGV",
    "Actuator",
    "ActuatorError",
    "ChildProcess",
    "ChildProcesses",
    "Drainer",
    "ExternalActuator",
    "LatestWeights",
    "LocalActuator",
    "NoDrainer",
    "ProxyDrainer",
    "SglangMegatronActuator",
]
