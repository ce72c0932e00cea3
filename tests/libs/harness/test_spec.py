"""Any harness plugs in as a command template: placeholders checked up front, run in the sandbox against the
gateway, and a harness that crashes, writes garbage or hangs ends with the reason the launcher can tell."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from opengyre.harness import PLACEHOLDERS, HarnessSpec, HarnessTarget, builtin_spec, run_harness
from opengyre.harness.cli import harness_app
from opengyre.runtime import EmbeddedNats
from opengyre.sandbox import SandboxLimits

from .conftest import Stack

MakeStack = Callable[..., Awaitable[Stack]]
LIMITS = SandboxLimits(timeout_s=60)

# A user's own harness: one chat call with the official SDK, the reply written into the workspace ({{ }}: braces).
OWN_HARNESS = """
import os, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=os.environ["MY_KEY"], max_retries=0)
task = open(sys.argv[2]).read()
reply = client.chat.completions.create(model=sys.argv[3], messages=[{{"role": "user", "content": task}}])
open("answer.txt", "w").write(reply.choices[0].message.content)
"""


def test_a_template_is_checked_when_the_spec_is_made() -> None:
    with pytest.raises(ValueError, match=r"unknown placeholder \{base_ur\}"):
        HarnessSpec("typo", ("agent", "--url", "{base_ur}"))
    with pytest.raises(ValueError, match="no format spec"):
        HarnessSpec("fmt", ("agent", "{api_key!r}"))
    with pytest.raises(ValueError, match="argv is empty"):
        HarnessSpec("empty", ())
    with pytest.raises(ValueError, match="unknown harness spec keys: cmd"):
        HarnessSpec.from_mapping({"name": "x", "cmd": ["a"]})
    with pytest.raises(ValueError, match="env must be a table of strings"):
        HarnessSpec.from_mapping({"name": "x", "argv": ["a"], "env": {"N": 1}})
    spec = HarnessSpec("codex", ("codex", "exec", "{{literal}}", "{instruction}"), {"OPENAI_BASE_URL": "{base_url}"})
    assert spec.placeholders == {"instruction", "base_url"}
    argv, env = spec.render({"instruction": "fix {it}", "base_url": "http://p/x/e/v1"})
    assert argv == ["codex", "exec", "{literal}", "fix {it}"] and env == {"OPENAI_BASE_URL": "http://p/x/e/v1"}
    with pytest.raises(ValueError, match="no value for base_url"):
        spec.render({"instruction": "x"})
    assert builtin_spec().placeholders <= PLACEHOLDERS.keys()


def test_a_spec_from_toml(tmp_path: Path) -> None:
    f = tmp_path / "claude.toml"
    f.write_text(
        'name = "claude-code"\nargv = ["claude", "-p", "{instruction}"]\n'
        '[env]\nANTHROPIC_BASE_URL = "{anthropic_base_url}"\nANTHROPIC_API_KEY = "{api_key}"\n'
    )
    spec = HarnessSpec.from_toml(f)
    assert spec.name == "claude-code" and spec.placeholders == {"instruction", "anthropic_base_url", "api_key"}


async def test_a_users_own_harness_runs_in_the_sandbox_through_the_gateway(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await make_stack(["forty-two"])
    spec = HarnessSpec(
        "mine",
        ("{python}", "-c", OWN_HARNESS, "{base_url}", "{instruction_file}", "{model}"),
        {"MY_KEY": "{api_key}"},
    )
    gw = stack.gateway
    target = HarnessTarget(gw.base_url("ex-own"), gw.issue_key("ex-own"), "opengyre-tiny", tmp_path, "What is 6*7?")
    out = await asyncio.to_thread(run_harness, spec, target, LIMITS)
    assert (out.exit_code, out.finish_reason, out.summary) == (0, "exited", None), out.stderr
    assert (tmp_path / "answer.txt").read_text() == "forty-two"
    assert "What is 6*7?" in stack.engine.prompts[0]
    [call] = await stack.recorded("ex-own")
    assert call.role == "main" and call.branch == "root"


# A harness that tries what the proxy being its only way out forbids, then does its job through the proxy.
PROBING_HARNESS = """
import os, socket, sys, openai
def reach(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        return "reached"
    except OSError as exc:
        return type(exc).__name__
try:
    secret = open(sys.argv[4]).read()
except OSError as exc:
    secret = type(exc).__name__
client = openai.OpenAI(base_url=sys.argv[1], api_key=os.environ["MY_KEY"], max_retries=0)
reply = client.chat.completions.create(model=sys.argv[2], messages=[{{"role": "user", "content": "hi"}}])
print(reply.choices[0].message.content, reach(int(sys.argv[3])), reach(int(sys.argv[5])), secret, os.getcwd())
"""


async def test_a_harness_reaches_the_model_through_the_proxy_and_nothing_else(
    make_stack: MakeStack, nats_server: EmbeddedNats, tmp_path: Path
) -> None:
    """The engine behind the proxy, the event log's NATS and a file of the host are out of the harness's reach:
    only its execution's base URL works (the sandbox's one egress endpoint), unchanged."""
    stack = await make_stack(["through-the-proxy"])
    secret = tmp_path / "data" / "proxy.secret"
    secret.parent.mkdir()
    secret.write_text("do-not-read")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    engine_port = urlsplit(stack.engine_url).port
    nats_port = urlsplit(nats_server.url).port
    spec = HarnessSpec(
        "probe",
        ("{python}", "-c", PROBING_HARNESS, "{base_url}", "{model}", str(engine_port), str(secret), str(nats_port)),
        {"MY_KEY": "{api_key}"},
    )
    gw = stack.gateway
    target = HarnessTarget(gw.base_url("ex-probe"), gw.issue_key("ex-probe"), "opengyre-tiny", workspace, "probe")
    out = await asyncio.to_thread(run_harness, spec, target, LIMITS)
    assert out.exit_code == 0 and out.isolation == "namespace", out.stderr
    words = out.stdout.split()
    assert words == [
        "through-the-proxy",
        "ConnectionRefusedError",
        "ConnectionRefusedError",
        "FileNotFoundError",
        "/app",
    ]
    [call] = await stack.recorded("ex-probe")
    assert call.role == "main"


def test_a_harness_sees_its_mounts_read_only_and_a_bad_mount_is_refused(tmp_path: Path) -> None:
    prefix = tmp_path / "prefix"  # a harness's own install dir, outside the system paths
    (prefix / "bin").mkdir(parents=True)
    (prefix / "bin" / "agent").write_text("echo from the prefix\n")
    f = tmp_path / "own.toml"
    f.write_text(
        'name = "own"\nargv = ["bash", "-c", "bash /opt/own/bin/agent; touch /opt/own/x 2>/dev/null || echo ro"]\n'
        f'[mounts]\n"{prefix}" = "/opt/own"\n'
    )
    spec = HarnessSpec.from_toml(f)
    assert spec.mounts == {str(prefix): "/opt/own"}
    ws = tmp_path / "ws"
    ws.mkdir()
    target = HarnessTarget("http://127.0.0.1:59999/x/e/v1", "k", "m", ws, "task")
    out = run_harness(spec, target, SandboxLimits(timeout_s=60))
    assert (out.exit_code, out.stdout, out.isolation) == (0, "from the prefix\nro\n", "namespace"), out.stderr
    with pytest.raises(ValueError, match="mount target 'opt' must be a normalised absolute path"):
        HarnessSpec("rel", ("a",), mounts={str(prefix): "opt"})
    with pytest.raises(ValueError, match="mounts must be a table of strings"):
        HarnessSpec.from_mapping({"name": "x", "argv": ["a"], "mounts": ["/opt"]})
    with pytest.raises(ValueError, match="does not exist"):
        run_harness(HarnessSpec("gone", ("true",), mounts={str(tmp_path / "gone"): "/opt/g"}), target)
    with pytest.raises(ValueError, match="mount it at its own path"):
        run_harness(spec, target, backend="none")


@pytest.mark.parametrize(
    ("script", "reason", "code"),
    [
        ("echo '{{not json' > {summary_file}; exit 3", "crashed", 3),  # garbage summary: the exit status decides
        ('echo \'{{"finish_reason": "max-turns"}}\' > {summary_file}; exit 3', "max-turns", 3),
        ("exec sleep 30", "timeout", 124),  # hangs: killed at the sandbox's time limit
        ("mkfifo {summary_file}; exit 3", "crashed", 3),  # a FIFO for a summary: read without blocking, not one
        ("ln -s /etc/hostname {summary_file}; exit 3", "crashed", 3),  # a symlink for a summary: not followed
    ],
)
def test_the_outcome_of_a_harness_that_crashes_writes_garbage_or_hangs(
    tmp_path: Path, script: str, reason: str, code: int
) -> None:
    spec = HarnessSpec("shell", ("bash", "-c", script))
    target = HarnessTarget("http://127.0.0.1:59999/x/e/v1", "k", "m", tmp_path, "task")
    out = run_harness(spec, target, SandboxLimits(timeout_s=1.0))
    assert (out.finish_reason, out.exit_code, out.timed_out) == (reason, code, reason == "timeout")


def test_a_harness_with_the_hosts_network_or_without_a_workspace_is_refused(tmp_path: Path) -> None:
    """The proxy is a harness's only way out (its sandbox's egress): the host's network is refused."""
    target = HarnessTarget("http://127.0.0.1:59999/x/e/v1", "k", "m", tmp_path, "task")
    with pytest.raises(ValueError, match="egress, and nothing else"):
        run_harness(builtin_spec(), target, SandboxLimits(network=True))
    remote = HarnessTarget("http://10.1.2.3:8080/x/e/v1", "k", "m", tmp_path, "task")
    with pytest.raises(ValueError, match="only loopback"):
        run_harness(builtin_spec(), remote, LIMITS)
    missing = HarnessTarget("http://127.0.0.1:59999/x/e/v1", "k", "m", tmp_path / "nope", "task")
    with pytest.raises(ValueError, match="is not a directory"):
        run_harness(builtin_spec(), missing, LIMITS)


def test_the_cli_prints_its_summary_and_exits_with_the_finish_reason(tmp_path: Path) -> None:
    # In process (``python -m opengyre.harness`` itself runs in the sandbox test of test_agent.py).
    cli = CliRunner()
    base = ["run", "--base-url", "http://127.0.0.1:59999/x/e/v1", "--api-key", "og1.e.main.x", "--model", "m"]
    run = cli.invoke(harness_app, [*base, "--task", "t", "--workdir", str(tmp_path), "--max-retries", "0"])
    assert run.exit_code == 5, run.output  # model-error
    assert json.loads(run.stdout)["finish_reason"] == "model-error" and "harness: model-error" in run.stderr
    both = cli.invoke(harness_app, [*base, "--task", "t", "--task-file", "f"])
    assert both.exit_code == 2 and "exactly one of --task and --task-file" in both.output


def test_the_cli_launches_a_spec_from_toml_in_the_sandbox(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(
        'name = "sh"\nargv = ["bash", "-c", "cat {instruction_file} > got.txt; echo $K > key.txt"]\n[env]\nK = "{api_key}"\n'
    )
    task, ws = tmp_path / "task.md", tmp_path / "ws"
    task.write_text("do it")
    ws.mkdir()
    args = ["launch", "--spec", str(spec), "--base-url", "http://127.0.0.1:59999/x/e/v1", "--model", "m"]
    run = CliRunner().invoke(
        harness_app, [*args, "--task-file", str(task), "--workdir", str(ws)], env={"OPENGYRE_HARNESS_KEY": "og1.k"}
    )
    assert run.exit_code == 0, run.output
    assert json.loads(run.stdout.splitlines()[0]) == {"exit_code": 0, "finish_reason": "exited", "summary": None}
    assert (ws / "got.txt").read_text() == "do it" and (ws / "key.txt").read_text() == "og1.k\n"
