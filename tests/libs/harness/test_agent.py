"""The reference harness against the real gateway (scripted policy behind it): tools really run in the workspace,
submit ends the episode, compaction and a sub-agent branch the recorded tree, and every fault has its reason."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

from opengyre.harness import AgentConfig, HarnessTarget, builtin_spec, run_agent, run_harness
from opengyre.sandbox import SandboxLimits
from opengyre.trajectory import TrajectoryTree

from ._scripted_engine import BROKEN, tool_call
from .conftest import Stack

MakeStack = Callable[..., Awaitable[Stack]]
M = "opengyre-tiny"


def _config(stack: Stack, eid: str, workdir: Path, **kw: object) -> AgentConfig:
    gw = stack.gateway
    return AgentConfig(base_url=gw.base_url(eid), api_key=gw.issue_key(eid), model=M, workdir=workdir, **kw)  # type: ignore[arg-type]


async def test_the_built_in_harness_in_its_sandbox_writes_runs_reads_and_submits(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await make_stack(
        [
            tool_call("write_file", {"path": "src/hello.sh", "content": "echo og-$((6 * 7))\n"}),
            tool_call("run_command", {"command": "bash src/hello.sh; pwd"}),
            tool_call("read_file", {"path": "src/hello.sh"}),
            tool_call("submit", {"answer": "printed og-42"}),
            tool_call("run_command", {"command": "touch after-submit"}),  # never asked for
        ]
    )
    target = HarnessTarget(
        stack.gateway.base_url("ex-h1"), stack.gateway.issue_key("ex-h1"), M, tmp_path, "Print the answer."
    )
    out = await asyncio.to_thread(run_harness, builtin_spec("--max-turns", "8"), target, SandboxLimits(timeout_s=120))
    assert out.exit_code == 0 and out.finish_reason == "submitted", out.stderr
    assert out.summary is not None and json.loads(out.stdout.strip().splitlines()[-1]) == out.summary
    assert (out.summary["turns"], out.summary["tool_calls"], out.summary["tool_errors"]) == (4, 4, 0)
    assert out.summary["answer"] == "printed og-42"
    assert (tmp_path / "src" / "hello.sh").read_text() == "echo og-$((6 * 7))\n"
    assert not (tmp_path / "after-submit").exists() and len(stack.engine.replies) == 1
    # The shell's output went back to the model: the third prompt holds it (and ran in the workspace, which the
    # harness's namespace sandbox shows at /app).
    assert "exit code 0\nog-42\n/app\n" in stack.engine.prompts[2]
    assert "echo og-$((6 * 7))" in stack.engine.prompts[3].rsplit("<tool_response>", 1)[-1]
    events = await stack.recorded("ex-h1")
    # The harness echoed every reply faithfully: each call extends the one before, token for token.
    assert [e.branch for e in events] == ["root", "extension", "extension", "extension"]
    assert all(e.role == "main" and e.drift is None for e in events)
    assert [e.tool_calls[0].name for e in events] == ["write_file", "run_command", "read_file", "submit"]


async def test_malformed_arguments_unknown_tools_and_plain_text_go_back_to_the_model(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await make_stack(
        [
            tool_call("write_file", '"{\\"path\\": \\"a.txt\\", \\"content\\": unquoted}"'),  # arguments: bad JSON
            tool_call("delete_everything", {}),
            tool_call("run_command", {"cmd": "ls"}),  # the wrong field
            tool_call("read_file", {"path": "../../etc/passwd"}),
            "I think I am done.",  # no tool call at all
            tool_call("run_command", {"command": "sleep 5; echo late"}),
            tool_call("submit", {}),
        ]
    )
    summary = await asyncio.to_thread(
        run_agent, _config(stack, "ex-bad", tmp_path, command_timeout_s=0.5), "Write a.txt."
    )
    assert summary.finish_reason == "submitted" and summary.answer == ""
    assert (summary.turns, summary.tool_calls, summary.tool_errors) == (7, 6, 4)
    p = stack.engine.prompts
    assert "error: the arguments are not valid JSON" in p[1]
    assert "error: unknown tool 'delete_everything'; the tools are: run_command, read_file" in p[2]
    assert "error: unknown argument(s) cmd" in p[3]
    assert "error: '../../etc/passwd' is outside the workspace" in p[4]
    assert "Continue with a tool call" in p[5]
    last = p[6].rsplit("<tool_response>", 1)[-1]
    assert last.startswith("command timed out after 0.5 s and was killed") and "late" not in last
    assert not (tmp_path / "a.txt").exists()


async def test_compaction_and_a_sub_agent_are_branches_of_the_recorded_tree(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    (tmp_path / "one.txt").write_text("1")
    stack = await make_stack(
        [
            tool_call("spawn_agent", {"task": "count the files"}),  # main
            tool_call("run_command", {"command": "ls | wc -l"}),  # sub-agent
            "The sub-agent ran ls: 1 file.",  # sub-agent's summary: its context passed the budget
            tool_call("submit", {"answer": "1 file"}),  # sub-agent, compacted
            "Main: the sub-agent counted 1 file.",  # main's summary
            tool_call("submit", {"answer": "done"}),  # main, compacted
        ]
    )
    summary = await asyncio.to_thread(
        run_agent, _config(stack, "ex-tree", tmp_path, context_budget_tokens=100), "How many files?"
    )
    assert summary.finish_reason == "submitted" and (summary.sub_agents, summary.compactions) == (1, 2)
    assert summary.model_calls == 6 and summary.turns == 2
    p = stack.engine.prompts
    assert "exit code 0\n1\n" in p[2] and "Summary so far:\nThe sub-agent ran ls: 1 file." in p[3]
    assert "the sub-agent finished: 1 file" in p[4] and "Summary so far:\nMain: the sub-agent counted" in p[5]
    events = await stack.recorded("ex-tree")
    assert [e.role for e in events] == ["main", "sub-agent", "sub-agent-summary", "sub-agent", "main-summary", "main"]
    c = [e.call_id for e in events]
    tree = TrajectoryTree("ex-tree", events)
    assert tree.node(c[1]).parent_call_id is None  # the sub-agent's conversation is a root of its own
    assert tree.node(c[2]).parent_call_id == c[1] and tree.node(c[4]).parent_call_id == c[0]  # summaries extend
    # After a compaction the conversation goes on from a new prompt: it branches off, never extends the summary.
    assert events[3].branch != "extension" and events[5].branch != "extension"
    assert tree.node(c[5]).parent_call_id != c[4] and tree.node(c[3]).parent_call_id != c[2]
    assert {c[2], c[3], c[4], c[5]} <= set(tree.leaves())
    assert tree.path_sequence(c[4]).role == "main-summary" and tree.path_sequence(c[3]).role == "sub-agent"


async def test_an_engine_that_breaks_mid_episode_is_a_model_error(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack([tool_call("write_file", {"path": "a.txt", "content": "a"}), BROKEN])
    summary = await asyncio.to_thread(run_agent, _config(stack, "ex-502", tmp_path, max_retries=1), "Write a.txt.")
    assert summary.finish_reason == "model-error" and "answered 502" in summary.message
    assert (tmp_path / "a.txt").read_text() == "a" and summary.turns == 1
    assert len(stack.engine.prompts) == 3  # the call and the SDK's one retry
    assert [e.branch for e in await stack.recorded("ex-502")] == ["root"]  # the failed call recorded nothing
    # What the rollout driver believes the harness's "model-error" by (the seal's failed_calls): both attempts.
    assert stack.gateway.failed_calls("ex-502") == 2


def test_an_unreachable_endpoint_is_a_model_error(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = AgentConfig(f"http://127.0.0.1:{port}/x/ex/v1", "og1.ex.main.0", M, tmp_path, max_retries=0)
    summary = run_agent(config, "anything")
    assert summary.finish_reason == "model-error" and "APIConnectionError" in summary.message
    assert summary.model_calls == 0 and summary.turns == 0


async def test_the_turn_limit_ends_an_episode_without_submit(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack([tool_call("run_command", {"command": "true"})] * 3)
    summary = await asyncio.to_thread(run_agent, _config(stack, "ex-turns", tmp_path, max_turns=2), "Loop.")
    assert summary.finish_reason == "max-turns" and summary.turns == 2 and len(stack.engine.replies) == 1


async def test_the_time_limit_ends_an_episode_as_a_timeout(make_stack: MakeStack, tmp_path: Path) -> None:
    stack = await make_stack([tool_call("run_command", {"command": "sleep 60; touch late"}), tool_call("submit", {})])
    config = _config(stack, "ex-time", tmp_path, time_limit_s=2.0, max_retries=0)
    summary = await asyncio.to_thread(run_agent, config, "Hang.")
    assert summary.finish_reason == "timeout" and "time limit of 2 s ran out" in summary.message
    assert not (tmp_path / "late").exists()  # the command was killed with the episode's time


async def test_a_prompt_over_the_context_drops_old_turns_and_goes_on(make_stack: MakeStack, tmp_path: Path) -> None:
    # The first prompt (system, tools, task) is ~1,750 tokens; with the command's 1,500 bytes back it is past 2,600.
    stack = await make_stack(
        [tool_call("run_command", {"command": "printf 'a%.0s' $(seq 1500); echo END"}), tool_call("submit", {})],
        context_length=2600,
    )
    summary = await asyncio.to_thread(run_agent, _config(stack, "ex-ctx", tmp_path), "Print a lot.")
    assert summary.finish_reason == "submitted" and summary.compactions == 1 and summary.turns == 2
    p = stack.engine.prompts
    assert len(p) == 2 and "Your earlier context was dropped" in p[1] and "aEND" in p[1]
    events = await stack.recorded("ex-ctx")
    assert [e.branch for e in events] == ["root", "root"]  # the refused call recorded nothing
