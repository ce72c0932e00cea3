"""Harnesses: the reference terminal agent, and any harness as a command template run in the task's sandbox.

- ``run_agent(AgentConfig(base_url, api_key, model, workdir), task)``: the built-in agent (OpenAI tool calls:
  run_command, read_file, write_file, spawn_agent, submit; context compaction; sub-agents). CLI:
  ``opengyre harness run`` / ``python -m opengyre.harness``.
- ``HarnessSpec`` (argv/env templates with ``{base_url}``, ``{api_key}``, ``{workdir}``, ...), ``builtin_spec()``,
  ``run_harness(spec, HarnessTarget(...))``: start any harness in the sandbox. See docs/harness.md.
"""

from ._agent import AgentConfig, AgentSummary, FinishReason, run_agent
from ._launch import HarnessOutcome, HarnessTarget, run_harness
from ._spec import PLACEHOLDERS, HarnessSpec, builtin_spec
from ._tools import Toolbox, ToolError

__all__ = [
    "PLACEHOLDERS",
    "AgentConfig",
    "AgentSummary",
    "FinishReason",
    "HarnessOutcome",
    "HarnessSpec",
    "HarnessTarget",
    "ToolError",
    "Toolbox",
    "builtin_spec",
    "run_agent",
    "run_harness",
]
