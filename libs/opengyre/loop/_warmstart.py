"""The warm start: SFT on the tasks' reference solutions before RL, so the policy starts from something that
has seen the tasks solved.

``reference_messages`` writes a task's reference solution as the reference harness would have solved it: an
OpenAI message list in its tool format (its system prompt, the instruction, a ``run_command`` tool call that
runs the solution, the tool's real output from running it in a fresh copy of the workspace, then ``submit``).
They are saved beside the checkpoint (``reference.jsonl``, OpenAI fine-tuning JSONL: ``opengyre train sft`` reads
it) and the SFT trains on them as the proxy would record them: rendered with the harness's tool definitions, the
tool calls in the model's tool-call format, loss on the assistant turns only (``sft_trees_from_messages``).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ._driver import TaskRef, WarmStart

__all__ = ["SFT_VERSION", "reference_messages", "sft_warm_start"]

SFT_VERSION = "sft"  # the weight version of the warm-started policy (a step-0 version to the scheduler)


def _tool_call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def reference_messages(task: TaskRef) -> list[dict[str, Any]]:
    """The reference solution as one episode of the reference harness (tool outputs are real, not made up)."""
    from opengyre.harness import MAIN_SYSTEM, Toolbox

    solve = (task.task_dir / "solution" / "solve.py").read_text()
    command = f"python3 - <<'PY'\n{solve.rstrip()}\nPY"
    with tempfile.TemporaryDirectory(prefix="og-reference-") as tmp:
        ws = Path(tmp) / "app"
        src = task.task_dir / "environment" / "workspace"
        shutil.copytree(src, ws, symlinks=True) if src.is_dir() else ws.mkdir()
        with Toolbox(ws) as tools:
            output = tools.call("run_command", json.dumps({"command": command}))
    return [
        {"role": "system", "content": MAIN_SYSTEM},
        {"role": "user", "content": task.instruction},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [_tool_call("call_0", "run_command", {"command": command})],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": output},
        {"role": "assistant", "content": None, "tool_calls": [_tool_call("call_1", "submit", {"answer": "done"})]},
        {"role": "tool", "tool_call_id": "call_1", "content": "submitted"},
    ]


def _sft(
    model: str, tasks: list[TaskRef], out: Path, epochs: int, lr: float, seed: int, say: Callable[[str], None]
) -> Path:
    from opengyre.harness import agent_tools
    from opengyre.models import model_state, resolve_model
    from opengyre.trainer import Learner, export_checkpoint, run_sft, sft_trees_from_messages
    from opengyre.trainer.algorithms import SFT
    from opengyre.trainer.backends import build_backend

    out.mkdir(parents=True, exist_ok=True)
    tools = agent_tools("main")  # what the reference harness sends with each call of its main conversation
    conversations = [{"messages": reference_messages(t), "tools": tools} for t in tasks]
    with (out / "reference.jsonl").open("w") as f:
        for c in conversations:
            f.write(json.dumps(c) + "\n")
    source = resolve_model(model)
    trees = sft_trees_from_messages(source, conversations, prefix="golden")
    weights, _ = source.load(seed=seed)
    learner = Learner(build_backend("torch", weights.config, model_state(weights), seed=seed), SFT(), lr=lr)
    results = run_sft(learner, trees, epochs=epochs, batch_size=8, seed=seed)
    ckpt = out / "checkpoint"
    export_checkpoint(learner.backend, ckpt, SFT_VERSION)
    nll = [f"{r.metrics['nll']:.3f}" for r in results]
    say(f"warm start: SFT on {len(trees)} reference solution(s), {len(results)} step(s), nll {nll[0]} -> {nll[-1]}")
    return ckpt


def sft_warm_start(
    model: str, *, epochs: int, lr: float, seed: int = 0, say: Callable[[str], None] = print
) -> WarmStart:
    """A ``run_loop`` warm start: SFT of ``model`` on the built tasks' reference solutions."""

    async def warm(tasks: list[TaskRef], folder: Path) -> Path | None:
        return await asyncio.to_thread(_sft, model, tasks, folder, epochs, lr, seed, say)

    return warm
