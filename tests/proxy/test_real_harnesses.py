"""Each real harness, unmodified and started from its preset, against the real gateway and a scripted
SGLang-protocol engine: the scripted model calls the harness's own shell tool, the harness runs it, and the model
then ends the task. Skipped, saying so, where the harness is not installed (``make harnesses`` installs them)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from opengyre.asgi import HttpServer
from opengyre.engine import EngineConfig, EngineServer
from opengyre.eventlog import EventLog
from opengyre.harness import HarnessSpec, HarnessTarget, harness_preset, run_harness
from opengyre.models import ModelSource
from opengyre.sandbox import SandboxLimits
from tests.apps.cli._cli import og

from ._scripted_sglang import scripted_sglang
from .conftest import make_stack

MODEL = "qwen3-8b"
PROOF = "og-proof-42"
COMMAND = "echo og-proof-$((6*7)) > proof.txt && cat proof.txt"  # the proof appears only once it ran

# harness -> (the executable, its shell tool's name, that tool's arguments for COMMAND, what ends the task)
SHELLS: dict[str, tuple[str, str, dict[str, str], str | None]] = {
    "claude-code": ("claude", "Bash", {"command": COMMAND, "description": "write the proof"}, None),
    "codex": ("codex", "exec_command", {"cmd": COMMAND}, None),
    "opencode": ("opencode", "bash", {"command": COMMAND, "description": "write the proof"}, None),
    "mini-swe-agent": (sys.executable, "bash", {"command": COMMAND}, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    "openai-agents": (sys.executable, "run_shell", {"command": COMMAND}, None),
}


_MODULES = {"openai-agents": "agents", "mini-swe-agent": "minisweagent"}  # run by this interpreter


def _installed(harness: str) -> bool:
    if harness in _MODULES:
        return importlib.util.find_spec(_MODULES[harness]) is not None
    return shutil.which(SHELLS[harness][0]) is not None


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _script(harness: str) -> Callable[[str], str]:
    _, tool, args, finish = SHELLS[harness]

    def reply(prompt: str) -> str:
        if PROOF in prompt:  # the tool ran and its output came back
            return _call(tool, {**args, ("cmd" if "cmd" in args else "command"): finish}) if finish else "Done."
        if f'"name": "{tool}"' in prompt:
            return _call(tool, args)
        return "Proof task"  # a helper call without the tools (OpenCode's title)

    return reply


@pytest.mark.parametrize("harness", sorted(SHELLS))
async def test_the_real_harness_runs_its_shell_tool_through_the_proxy(
    harness: str, event_log: EventLog, tmp_path: Path
) -> None:
    if not _installed(harness):
        pytest.skip(f"{harness} is not installed here (make harnesses installs the pinned version)")
    app, prompts = scripted_sglang(_script(harness), context_length=1 << 18)
    engine = HttpServer(app)
    await engine.start()
    st = await make_stack(event_log, {}, models=(MODEL,))
    try:
        await st.gateway.pool.add("scripted", engine.url)
        eid = f"ex-{harness}"
        work, home = tmp_path / "work", tmp_path / "home"
        work.mkdir()
        home.mkdir()
        task = work.parent / "task.md"
        task.write_text("Write the proof file with the shell tool, then stop.")
        argv, env = harness_preset(harness).render(
            {
                "base_url": st.gateway.base_url(eid),
                "anthropic_base_url": f"{st.gateway.url}/x/{eid}",
                "api_key": st.gateway.issue_key(eid),
                "model": MODEL,
                "context_length": str(st.gateway.served_context().tokens),
                "workdir": str(work),
                "instruction": task.read_text(),
                "instruction_file": str(task),
                "summary_file": str(tmp_path / "summary.json"),
                "python": sys.executable,
            }
        )
        base = {k: os.environ[k] for k in ("PATH", "LANG") if k in os.environ}
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=work,
            env={**base, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"), **env},
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        assert proc.returncode == 0, text[-3000:]
        assert (work / "proof.txt").read_text().strip() == PROOF, text[-3000:]
        assert st.gateway.stats.rejected == {}, text[-3000:]
        events = await st.recorded()
        mains = [e for e in events if e.role == "main"]
        assert any(t.arguments and "og-proof" in t.arguments for e in mains for t in e.tool_calls)
        assert any(PROOF in p for p in prompts)  # the harness sent its tool's output back
    finally:
        await st.gateway.stop()
        await engine.stop()


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a 135M-parameter model tokenizing Claude Code's prompt on 2 shared cores
async def test_claude_code_behind_the_real_smollm2_is_told_its_prompt_is_too_long_and_status_says_why(
    smollm2: ModelSource, tmp_path: Path
) -> None:
    """Claude Code's system prompt and tools alone are longer than SmolLM2's 8,192-token context. Told the served
    context (its preset sets its window from ``ExecutionAccess.context_length``) it says "Prompt is too long" and
    sends nothing; with a window it does not know (a spec without it) it sends the call, the proxy answers
    Anthropic's own error, which Claude Code shows as it would the vendor's, and ``opengyre status`` says what
    context the proxy serves, where that figure comes from, and that the call was refused for it."""
    if not _installed("claude-code"):
        pytest.skip("claude-code is not installed here (make harnesses installs the pinned version)")
    assert smollm2.checkpoint is not None
    data = tmp_path / "og"
    cfg = EngineConfig(preset="smollm2-135m", model_cache=smollm2.checkpoint.parent, port=0)
    async with EngineServer(cfg) as srv:
        env = {
            "OPENGYRE_PROXY_MODELS": cfg.model_name,
            "OPENGYRE_PROXY_TOKENIZER": str(smollm2.tokenizer_dir),
        }
        up = await asyncio.to_thread(
            og, "up", "--detach", "--data-dir", str(data), "--services", "proxy", "--engine", srv.url, env=env
        )
        assert up.returncode == 0, up.stdout + up.stderr
        try:
            got = await asyncio.to_thread(og, "proxy", "key", "ex-cc-smol", "--data-dir", str(data))
            access = json.loads(got.stdout)
            work = tmp_path / "work"
            work.mkdir()
            limits = SandboxLimits(timeout_s=600, memory_mb=8192)
            async with httpx.AsyncClient(timeout=30) as c:  # the engine serves from this event loop
                served = int((await c.get(f"{srv.url}/model_info")).json()["context_length"])
            target = HarnessTarget(access["base_url"], access["api_key"], cfg.model_name, work, "Say hi.", served)
            told = await asyncio.to_thread(run_harness, harness_preset("claude-code"), target, limits)
            shown = told.stdout + told.stderr
            assert told.exit_code != 0 and "prompt is too long" in shown.lower(), shown[-3000:]
            preset = harness_preset("claude-code")
            unknown = HarnessSpec(
                "claude-code-own-window",
                preset.argv,
                {k: v for k, v in preset.env.items() if k != "CLAUDE_CODE_MAX_CONTEXT_TOKENS"},
                preset.mounts,
            )
            out = await asyncio.to_thread(run_harness, unknown, target, limits)
            shown = out.stdout + out.stderr
            assert out.exit_code != 0 and "prompt is too long" in shown.lower(), shown[-3000:]
            status = await asyncio.to_thread(og, "status", "--data-dir", str(data), env={"COLUMNS": "4000"})
            said = status.stdout
            served = "proxy: serves a context of 8192 tokens, from engine "
            assert served in said and "'s own (its /model_info context_length" in said, said
            refused = re.search(r"(\d+) call\(s\) refused as longer than the served context; the last: anthropic: "
                                r"prompt is too long: (\d+) tokens > 8191 maximum", said)  # fmt: skip
            assert refused is not None and int(refused.group(1)) >= 1 and int(refused.group(2)) > 8191, said
        finally:
            await asyncio.to_thread(og, "down", "--data-dir", str(data))
