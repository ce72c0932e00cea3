"""The closed loop: a run configuration in, skills turned into tasks, rolled out, scored, trained, hardened.

- ``RunConfig.from_toml(path)``: the run (skills, patterns, group size, steps, cells, policy, model, seed).
- ``run_loop(config, settings, say=print)``: the whole run on the embedded stack of ``settings.data_dir``; a
  client of the services only (every event is appended by its owner). CLI: ``opengyre train loop RUN.toml``.
  ``attach=True`` (``--attach``): on a deployment already running (``opengyre up``), started with
  ``deployment_env(config)`` and ``write_trainer_toml`` (CLI: ``opengyre train env RUN.toml``).
- ``end_execution``: the one place an execution ends (the proxy seals it, the trainer grades its workspace).
"""

from ._config import RunConfig, RunConfigError
from ._deployment import DeploymentMismatch, deployment_env, scheduler_env, trainer_settings, write_trainer_toml
from ._driver import AfterStart, BeforeStop, LoopResult, TaskRef, WarmStart, run_loop
from ._rollout import Assignment, Finished, end_execution, harness_failure, roll_out
from ._warmstart import SFT_VERSION, reference_messages, sft_warm_start

__all__ = [
    "SFT_VERSION",
    "AfterStart",
    "Assignment",
    "BeforeStop",
    "DeploymentMismatch",
    "Finished",
    "LoopResult",
    "RunConfig",
    "RunConfigError",
    "TaskRef",
    "WarmStart",
    "deployment_env",
    "end_execution",
    "harness_failure",
    "reference_messages",
    "roll_out",
    "run_loop",
    "scheduler_env",
    "sft_warm_start",
    "trainer_settings",
    "write_trainer_toml",
]
