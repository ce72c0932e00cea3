"""Presets: the real harnesses as ``HarnessSpec`` templates, at the versions pinned in ``harnesses.toml``.

Each runs the harness unmodified against an execution's base URL and key, with its telemetry, update checks
and other traffic off (a sandbox's only network is the proxy). ``make harnesses`` installs the pinned versions.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import tomllib
from importlib import resources
from pathlib import Path
from typing import Any

from ._spec import HarnessSpec

__all__ = [
    "HARNESS_VERSIONS",
    "HarnessNotInstalled",
    "check_installed",
    "harness_preset",
    "install_command",
    "preset_names",
]


def _versions() -> dict[str, dict[str, str]]:
    data: dict[str, Any] = tomllib.loads(resources.files(__package__).joinpath("harnesses.toml").read_text())
    return {k: dict(v) for k, v in data.items()}


HARNESS_VERSIONS: dict[str, dict[str, str]] = _versions()

_QUIET_CLAUDE = {
    "DISABLE_TELEMETRY": "1",
    "DISABLE_AUTOUPDATER": "1",
    "DISABLE_ERROR_REPORTING": "1",
    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
}

# OpenCode's inline config: an OpenAI-compatible provider, no update check, no sharing. Its JSON braces are
# doubled for the template.
_OPENCODE_CONFIG = json.dumps(
    {
        "autoupdate": False,
        "share": "disabled",
        "model": "opengyre/@MODEL@",
        "provider": {
            "opengyre": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "OpenGyre",
                "options": {"baseURL": "@BASE_URL@", "apiKey": "@API_KEY@"},
                "models": {"@MODEL@": {"name": "@MODEL@"}},
            }
        },
    }
)
_OPENCODE_CONFIG = (
    _OPENCODE_CONFIG.replace("{", "{{")
    .replace("}", "}}")
    .replace("@MODEL@", "{model}")
    .replace("@BASE_URL@", "{base_url}")
    .replace("@API_KEY@", "{api_key}")
)

# The OpenAI Agents SDK is a library: a small agent with one shell tool, over Chat Completions at base_url.
_OPENAI_AGENTS = """
import asyncio, os, subprocess, sys
from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI
set_tracing_disabled(True)
@function_tool
def run_shell(command: str) -> str:
    '''Run a shell command in the workspace; returns its exit code and output.'''
    p = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=600)
    return f"exit {p.returncode}\\n{p.stdout}{p.stderr}"
client = AsyncOpenAI(base_url=os.environ["OPENAI_BASE_URL"], api_key=os.environ["OPENAI_API_KEY"])
agent = Agent(name="agent", instructions="Solve the task in the workspace with the shell tool.",
              tools=[run_shell], model=OpenAIChatCompletionsModel(model=sys.argv[1], openai_client=client))
result = asyncio.run(Runner.run(agent, open(sys.argv[2]).read(), max_turns=50))
print(result.final_output)
""".replace("{", "{{").replace("}", "}}")


def _presets() -> dict[str, HarnessSpec]:
    return {
        "claude-code": HarnessSpec(
            "claude-code",
            ("claude", "-p", "{instruction}", "--model", "{model}", "--dangerously-skip-permissions"),
            {
                "ANTHROPIC_BASE_URL": "{anthropic_base_url}",
                "ANTHROPIC_API_KEY": "{api_key}",
                "IS_SANDBOX": "1",  # it refuses --dangerously-skip-permissions as root outside a sandbox it knows
                # It takes a model it does not know for a 1M-token one and would never compact before the proxy
                # refuses the prompt: the context served is its window.
                "CLAUDE_CODE_MAX_CONTEXT_TOKENS": "{context_length}",
                **_QUIET_CLAUDE,
            },
        ),
        "codex": HarnessSpec(
            "codex",
            (
                "codex",
                "exec",
                "--skip-git-repo-check",
                "--sandbox",
                "danger-full-access",  # the task's sandbox is the boundary; Codex's own needs privileges
                "-m",
                "{model}",
                "-c",
                'model_provider="opengyre"',
                "-c",
                'model_providers.opengyre.name="OpenGyre"',
                "-c",
                'model_providers.opengyre.base_url="{base_url}"',
                "-c",
                'model_providers.opengyre.env_key="OPENGYRE_KEY"',
                "-c",
                'model_providers.opengyre.wire_api="responses"',  # its only wire since 0.1xx
                "-c",
                'web_search="disabled"',  # a hosted tool: the proxy refuses it (docs/proxy.md)
                "-c",
                "model_context_window={context_length}",  # an unknown model's window: compact before the proxy refuses
                "-c",
                "check_for_update_on_startup=false",
                "-c",
                "analytics.enabled=false",
                "-c",
                "feedback.enabled=false",
                "{instruction}",
            ),
            {"OPENGYRE_KEY": "{api_key}"},
        ),
        "opencode": HarnessSpec(
            "opencode",
            ("opencode", "run", "--model", "opengyre/{model}", "{instruction}"),
            {"OPENCODE_CONFIG_CONTENT": _OPENCODE_CONFIG},
        ),
        "mini-swe-agent": HarnessSpec(
            "mini-swe-agent",
            # Its CLI module under the interpreter it is installed in (its `mini` script may not be on PATH).
            (
                "{python}",
                "-m",
                "minisweagent.run.mini",
                "--model",
                "openai/{model}",
                "--task",
                "{instruction}",
                "--yolo",
                "--exit-immediately",
            ),
            {
                "OPENAI_API_BASE": "{base_url}",
                "OPENAI_API_KEY": "{api_key}",
                "MSWEA_CONFIGURED": "true",  # no first-run setup wizard
                "MSWEA_COST_TRACKING": "ignore_errors",  # the served model has no price in litellm's table
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # litellm's price table from the wheel, not the network
            },
        ),
        "openai-agents": HarnessSpec(
            "openai-agents",
            ("{python}", "-c", _OPENAI_AGENTS, "{model}", "{instruction_file}"),
            {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}", "OPENAI_AGENTS_DISABLE_TRACING": "1"},
        ),
    }


def preset_names() -> list[str]:
    return sorted(HARNESS_VERSIONS)


def harness_preset(name: str) -> HarnessSpec:
    """The preset for ``name`` (one of ``preset_names()``); the harness must be installed (``make harnesses``)."""
    presets = _presets()
    if name not in presets:
        raise ValueError(f"no harness preset {name!r}; known: {', '.join(sorted(presets))}")
    return presets[name]


class HarnessNotInstalled(ValueError):
    """A preset's harness is not installed here, or not at its pinned version; the message says how to install it."""


def install_command(name: str) -> str:
    """The command that installs the pinned version of preset ``name``'s harness."""
    pin = HARNESS_VERSIONS[name]
    if "npm" in pin:
        return f"npm install -g {pin['npm']}@{pin['version']}"
    return f"pip install {pin['pip']}=={pin['version']}"


def _npm_version(executable: str, package: str) -> str | None:
    """The version of the npm package an executable on PATH belongs to (its ``package.json``, up from the
    script the link points at); None where none is found."""
    script = Path(os.path.realpath(executable))
    for folder in list(script.parents)[:6]:
        manifest = folder / "package.json"
        if manifest.is_file():
            try:
                data = json.loads(manifest.read_text())
            except (OSError, ValueError):
                return None
            if isinstance(data, dict) and data.get("name") == package:
                return str(data.get("version"))
    return None


def _installed_version(pin: dict[str, str]) -> str | None:
    """The installed version ("" where it is there but its version cannot be told), None where it is not."""
    if "npm" in pin:
        found = shutil.which(pin["bin"])
        return None if found is None else (_npm_version(found, pin["npm"]) or "")
    if importlib.util.find_spec(pin["module"]) is None:
        return None
    try:
        return importlib.metadata.version(pin["pip"])
    except importlib.metadata.PackageNotFoundError:
        return ""


def check_installed(name: str) -> None:
    """Preset ``name``'s harness is installed at its pinned version (npm CLIs on PATH, Python ones importable by
    this interpreter, which runs them), else ``HarnessNotInstalled`` saying how to install it."""
    if name not in HARNESS_VERSIONS:
        raise ValueError(f"no harness preset {name!r}; known: {', '.join(preset_names())}")
    pin = HARNESS_VERSIONS[name]
    found = _installed_version(pin)
    how = f"`{install_command(name)}` (`make harnesses` installs every pinned harness)"
    if found is None:
        raise HarnessNotInstalled(f"harness {name} is not installed: {how}")
    if found and found != pin["version"]:
        raise HarnessNotInstalled(f"harness {name}: {found} is installed, {pin['version']} is pinned: {how}")
