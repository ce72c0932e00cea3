"""Which backend runs a command: chosen by name, never downgraded silently; ``opengyre sandbox check``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.sandbox import LocalSandbox, Mount, SandboxError, SandboxLimits, backend_names, open_sandbox


def test_backends_are_chosen_by_name_explicitly_or_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"namespace", "none"} <= set(backend_names())
    monkeypatch.delenv("OPENGYRE_SANDBOX", raising=False)
    with LocalSandbox() as sb:
        assert sb.run(["true"]).isolation == "namespace"
    monkeypatch.setenv("OPENGYRE_SANDBOX", "none")
    with LocalSandbox() as sb:
        assert sb.run(["true"]).isolation == "none"
    with LocalSandbox(backend="namespace") as sb:  # the caller's word over the environment's
        assert sb.run(["true"]).isolation == "namespace"
    monkeypatch.setenv("OPENGYRE_SANDBOX", "chroot")
    with pytest.raises(SandboxError, match="unknown sandbox backend 'chroot'"):
        LocalSandbox()


def test_the_process_backend_says_so_every_time_it_opens(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="opengyre.sandbox"):
        for _ in range(2):
            with open_sandbox(backend="none") as sb:
                assert sb.isolation == "none"
    assert sum("without isolation" in r.getMessage() for r in caplog.records) == 2


def test_where_namespaces_cannot_be_made_the_namespace_backend_refuses_with_bwraps_cause(tmp_path: Path) -> None:
    """Inside one of our sandboxes bwrap cannot mount a /proc: a namespace sandbox asked for there by its class
    (not through the selection, which nests) fails to open, naming bwrap's own words, and runs nothing."""
    code = (
        "from opengyre.sandbox import NamespaceSandbox, SandboxError\n"
        "try:\n    NamespaceSandbox().open()\nexcept SandboxError as exc:\n    print('refused:', exc)\n"
    )
    with LocalSandbox(SandboxLimits(timeout_s=60)) as sb:
        r = sb.run([sys.executable, "-c", code])
    assert r.ok, r.stderr
    assert r.stdout.startswith("refused: namespace sandbox unavailable:") and "proc" in r.stdout
    assert "OPENGYRE_SANDBOX=none" in r.stdout


def test_paths_translate_between_the_host_and_the_sandbox(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "src").mkdir(parents=True)
    for backend, seen in (("namespace", "/app"), ("none", str(ws))):
        with LocalSandbox(mounts=[Mount(ws, "/app", writable=True)], backend=backend) as sb:
            assert sb.inside(ws / "src") == f"{seen}/src" and sb.inside(sb.root / "x") == str(sb.root / "x")
            r = sb.run(["pwd"], cwd="/app/src")  # a mount's target as the cwd: where the command sees it
            assert r.stdout.strip() == f"{seen}/src"
            with pytest.raises(SandboxError, match="neither under"):
                sb.inside(tmp_path)
    with pytest.raises(ValueError, match="normalised absolute"):
        Mount(ws, "app")
    with pytest.raises(ValueError, match="own places"):
        LocalSandbox(mounts=[Mount(ws, "/usr/local")])
    with pytest.raises(SandboxError, match="does not exist"):
        LocalSandbox(mounts=[Mount(tmp_path / "missing", "/app")]).open()


def test_sandbox_check_reports_each_backend() -> None:
    r = CliRunner().invoke(app, ["sandbox", "check"])
    assert r.exit_code == 0, r.output
    assert "namespace (selected): ok" in r.output and "egress bridge: works" in r.output
    assert "uid inside: 1000 (the host's uid" in r.output and "capabilities: 0" in r.output
    assert "interfaces lo (loopback only)" in r.output and "kernel knobs (/proc/sys): read-only" in r.output
    assert "none: ok" in r.output and "process limit:" in r.output
    assert "memory: a memory cgroup per command" in r.output or "memory: NONE: no memory cgroup" in r.output
    bad = CliRunner().invoke(app, ["sandbox", "check", "--backend", "nope"])
    assert bad.exit_code == 2 and "unknown backend" in bad.output
