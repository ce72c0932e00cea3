"""The shipped harness presets: one per pinned harness, each a valid template that puts the key in the
environment (argv is visible to every process) and turns the harness's own outside traffic off."""

from __future__ import annotations

import json

import pytest

from opengyre.harness import HARNESS_VERSIONS, PLACEHOLDERS, harness_preset, preset_names

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
    _, env = harness_preset("claude-code").render(VALUES)
    assert env["ANTHROPIC_BASE_URL"] == "<anthropic_base_url>" and env["DISABLE_AUTOUPDATER"] == "1"
    _, env = harness_preset("opencode").render(VALUES)
    config = json.loads(env["OPENCODE_CONFIG_CONTENT"])
    assert config["autoupdate"] is False
    assert config["provider"]["opengyre"]["options"] == {"baseURL": "<base_url>", "apiKey": "<api_key>"}
    with pytest.raises(ValueError, match="no harness preset 'aider'"):
        harness_preset("aider")
