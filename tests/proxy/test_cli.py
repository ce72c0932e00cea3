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
    load_or_create_secret(tmp_path / "proxy.secret")  # as the proxy service does at its start
    r = CliRunner().invoke(app, ["proxy", "key", "ex-7", "--role", "sub-agent", "--data-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["base_url"] == "http://127.0.0.1:9999/x/ex-7/v1"
    claim = ExecutionKeys(load_or_create_secret(tmp_path / "proxy.secret")).verify(out["api_key"])
    assert claim is not None and (claim.execution_id, claim.role) == ("ex-7", "sub-agent")
    bad = CliRunner().invoke(app, ["proxy", "key", "ex.7", "--data-dir", str(tmp_path)])
    assert bad.exit_code != 0
    assert CliRunner().invoke(app, ["engine", "--help"]).exit_code == 0


def test_proxy_key_without_the_proxys_secret_is_refused_naming_where_it_looked(tmp_path: Path) -> None:
    r = CliRunner().invoke(app, ["proxy", "key", "ex-7", "--data-dir", str(tmp_path / "elsewhere")])
    said = r.output.replace("\n", "")  # the console wraps a long path at its width, inside words too
    assert r.exit_code == 2 and "no proxy.secret in" in said and "elsewhere" in said
    assert not (tmp_path / "elsewhere").exists()  # no secret the running proxy does not know was made


async def test_proxy_tree_and_atif_read_the_store(event_log: object, tmp_path: Path) -> None:
    from opengyre.eventlog import EventLog
    from opengyre.events import ModelCallRecorded
    from opengyre.projection import replay_into
    from opengyre.proxy import TrajectoryProjection
    from opengyre.store import create_db_engine, migrate

    assert isinstance(event_log, EventLog)
    msgs = [{"role": "user", "content": "hi"}]
    await event_log.append_many(
        [
            ModelCallRecorded(
                execution_id="ex-c",
                call_id="a",
                prompt_delta_ids=[1, 2],
                output_ids=[3],
                output_logprobs=[-0.1],
                branch="root",
                context={"base": 0, "messages": msgs, "response": {"role": "assistant", "content": "x"}},
            ),
            ModelCallRecorded(
                execution_id="ex-c",
                call_id="b",
                parent_call_id="a",
                prefix_len=3,
                prompt_delta_ids=[4],
                output_ids=[5, 6],
                output_logprobs=[-0.2, -0.3],
                branch="extension",
                context={
                    "base": 2,
                    "messages": [{"role": "user", "content": "y"}],
                    "response": {"role": "assistant", "content": "z"},
                },
            ),
        ]
    )
    url = f"sqlite:///{tmp_path / 'store.db'}"
    engine = create_db_engine(url)
    migrate(engine)
    await replay_into(TrajectoryProjection(), event_log, engine)
    engine.dispose()
    r = CliRunner().invoke(app, ["proxy", "tree", "ex-c", "--db-url", url])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0].startswith("a ") and lines[1].startswith("  b ") and lines[1].endswith("leaf")
    r = CliRunner().invoke(app, ["proxy", "atif", "ex-c", "--db-url", url])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert [s["source"] for s in doc["steps"]] == ["user", "agent", "user", "agent"]
    assert doc["steps"][3]["metrics"]["prompt_token_ids"] == [1, 2, 3, 4]
    assert CliRunner().invoke(app, ["proxy", "tree", "nobody", "--db-url", url]).exit_code != 0
