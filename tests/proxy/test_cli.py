"""``opengyre proxy key`` prints access the gateway accepts; ``opengyre engine`` is registered."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from opengyre.cli import app
from opengyre.proxy import ExecutionKeys
from opengyre.proxy._keys import load_or_create_secret


def test_proxy_key_prints_a_key_the_gateway_verifies(tmp_path: Path) -> None:
    (tmp_path / "proxy.url").write_text("http://127.0.0.1:9999\n")
    r = CliRunner().invoke(app, ["proxy", "key", "ex-7", "--role", "sub-agent", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["base_url"] == "http://127.0.0.1:9999/x/ex-7/v1"
    claim = ExecutionKeys(load_or_create_secret(tmp_path / "proxy.secret")).verify(out["api_key"])
    assert claim is not None and (claim.execution_id, claim.role) == ("ex-7", "sub-agent")
    bad = CliRunner().invoke(app, ["proxy", "key", "ex.7", "--data-dir", str(tmp_path)])
    assert bad.exit_code != 0
    assert CliRunner().invoke(app, ["engine", "--help"]).exit_code == 0
