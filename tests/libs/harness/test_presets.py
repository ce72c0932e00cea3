"""The shipped harness presets: one per pinned harness, each a valid template that puts the key in the
environment (argv is visible to every process) and turns the harness's own outside traffic off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opengyre.harness import (
    HARNESS_VERSIONS,
    PLACEHOLDERS,
    HarnessNotInstalled,
    HarnessTarget,
    check_installed,
    harness_preset,
    install_command,
    preset_names,
    run_harness,
)
from opengyre.sandbox import SandboxLimits

VALUES = {k: f"<{k}>" for k in PLACEHOLDERS}


def test_every_pinned_harness_has_a_preset_and_a_version() -> None:
    assert preset_names() == ["claude-code", "codex", "mini-swe-agent", "openai-agents", "opencode"]
    for name in preset_names():
        v = HARNESS_VERSIONS[name]
        assert v["version"].count(".") == 2 and ("npm" in v) != ("pip" in v), name
        argv, env = harness_preset(name).render(VALUES)
        assert "<api_key>" not in " ".join(argv), name  # the key only in the environment
        assert any("<api_key>" in val for val in env.values()), name


def test_the_presets_say_what_each_harness_needs() -> None:
    argv, env = harness_preset("codex").render(VALUES)
    assert "--full-auto" not in argv and 'model_providers.opengyre.wire_api="responses"' in argv
    assert 'web_search="disabled"' in argv  # a hosted tool the proxy refuses
    assert "model_context_window=<context_length>" in argv  # the window of a model it does not know
    _, env = harness_preset("claude-code").render(VALUES)
    assert env["ANTHROPIC_BASE_URL"] == "<anthropic_base_url>" and env["DISABLE_AUTOUPDATER"] == "1"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "<context_length>"
    _, env = harness_preset("opencode").render(VALUES)
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["autoupdate"] is False
    assert config["provider"]["opengyre"]["options"] == {"baseURL": "<base_url>", "apiKey": "<api_key>"}
    with pytest.raises(ValueError, match="no harness preset 'aider'"):
        harness_preset("aider")


def _npm_install(prefix: Path, package: str, version: str, executable: str) -> None:
    """An npm -g layout: the package under lib/node_modules, its executable in bin/ a link to its script."""
    pkg = prefix / "lib" / "node_modules" / package
    (pkg / "bin").mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": package, "version": version}))
    (pkg / "bin" / "cli.js").write_text("#!/usr/bin/env node\n")
    (pkg / "bin" / "cli.js").chmod(0o755)
    (prefix / "bin").mkdir()
    (prefix / "bin" / executable).symlink_to(pkg / "bin" / "cli.js")


def test_an_npm_harness_is_installed_only_at_its_pinned_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pin = HARNESS_VERSIONS["codex"]
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(HarnessNotInstalled) as err:
        check_installed("codex")
    assert str(err.value) == (
        f"harness codex is not installed: `npm install -g @openai/codex@{pin['version']}` (`make harnesses` installs "
        "every pinned harness)"
    )
    _npm_install(tmp_path, pin["npm"], "0.1.0", "codex")
    with pytest.raises(HarnessNotInstalled, match=rf"harness codex: 0\.1\.0 is installed, {pin['version']} is pinned"):
        check_installed("codex")
    (tmp_path / "lib" / "node_modules" / pin["npm"] / "package.json").write_text(
        json.dumps({"name": pin["npm"], "version": pin["version"]})
    )
    check_installed("codex")
    assert install_command("codex") == f"npm install -g @openai/codex@{pin['version']}"


def test_a_python_harness_is_importable_at_its_pinned_version() -> None:
    # mini-swe-agent and the Agents SDK are dev dependencies, pinned to the presets' versions.
    for name in ("mini-swe-agent", "openai-agents"):
        check_installed(name)
    with pytest.raises(ValueError, match="no harness preset 'aider'"):
        check_installed("aider")


def test_a_preset_that_needs_the_served_context_is_refused_without_it(tmp_path: Path) -> None:
    target = HarnessTarget("http://127.0.0.1:59999/x/e/v1", "k", "m", tmp_path, "task")  # no context_length
    with pytest.raises(ValueError, match="harness 'claude-code': no value for context_length"):
        run_harness(harness_preset("claude-code"), target, SandboxLimits(timeout_s=10))
