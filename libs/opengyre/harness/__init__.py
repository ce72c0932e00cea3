"""Harnesses: the reference terminal agent, and any harness as a command template run in the task's sandbox.

- ``run_agent(AgentConfig(base_url, api_key, model, workdir), task)``: the built-in agent (OpenAI tool calls:
  run_command, read_file, write_file, spawn_agent, submit; context compaction; sub-agents). CLI:
  ``opengyre harness run`` / ``python -m opengyre.harness``.
- ``HarnessSpec`` (argv/env templates with ``{base_url}``, ``{api_key}``, ``{workdir}``, ...), ``builtin_spec()``,
  ``run_harness(spec, HarnessTarget(...))``: start any harness in the sandbox. See docs/harness.md.
- ``harness_preset(name)``: Claude Code, Codex, OpenCode, mini-swe-agent, the OpenAI Agents SDK as specs, at the
  versions in ``harnesses.toml`` (``HARNESS_VERSIONS``; ``make harnesses`` installs them); ``check_installed(name)``
  raises ``HarnessNotInstalled`` (saying how to install it) where one is not installed at its pinned version.

Names load on first use: the CLI imports this package on every command and must not pay for the openai SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opengyre._lazy import lazy_exports

if TYPE_CHECKING:
    from ._agent import MAIN_SYSTEM, AgentConfig, AgentSummary, FinishReason, agent_tools, run_agent
    from ._launch import SKILLS_DIR, HarnessOutcome, HarnessTarget, run_harness
    from ._presets import (
        HARNESS_VERSIONS,
        HarnessNotInstalled,
        check_installed,
        harness_preset,
        install_command,
        preset_names,
    )
    from ._spec import PLACEHOLDERS, HarnessSpec, builtin_spec
    from ._tools import Toolbox, ToolError

_WHERE = {
    "MAIN_SYSTEM": "_agent",
    "AgentConfig": "_agent",
    "AgentSummary": "_agent",
    "FinishReason": "_agent",
    "run_agent": "_agent",
    "agent_tools": "_agent",
    "SKILLS_DIR": "_launch",
    "HarnessOutcome": "_launch",
    "HarnessTarget": "_launch",
    "run_harness": "_launch",
    "HARNESS_VERSIONS": "_presets",
    "harness_preset": "_presets",
    "HarnessNotInstalled": "_presets",
    "check_installed": "_presets",
    "install_command": "_presets",
    "preset_names": "_presets",
    "PLACEHOLDERS": "_spec",
    "HarnessSpec": "_spec",
    "builtin_spec": "_spec",
    "Toolbox": "_tools",
    "ToolError": "_tools",
}

__getattr__ = lazy_exports(__name__, _WHERE)

__all__ = [
    "HARNESS_VERSIONS",
    "MAIN_SYSTEM",
    "PLACEHOLDERS",
    "SKILLS_DIR",
    "AgentConfig",
    "AgentSummary",
    "FinishReason",
    "HarnessNotInstalled",
    "HarnessOutcome",
    "HarnessSpec",
    "HarnessTarget",
    "ToolError",
    "Toolbox",
    "agent_tools",
    "builtin_spec",
    "check_installed",
    "harness_preset",
    "install_command",
    "preset_names",
    "run_agent",
    "run_harness",
]
