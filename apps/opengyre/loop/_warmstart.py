"""The warm start: SFT on the tasks' reference solutions before RL, so the policy starts from something that
has seen the tasks solved.

``reference_messages`` writes a task's reference solution as the reference harness would have solved it: an
OpenAI message list in its tool format (its system prompt, the instruction, a ``run_command`` tool call that
runs the solution, the tool's real output from running it in a fresh copy of the workspace, then ``submit``).
They are saved beside the checkpoint (``reference.jsonl``, OpenAI fine-tuning JSONL: ``opengyre train sft`` reads
it) and the SFT trains on them as the proxy would record them: rendered with the harness's tool definitions, the
tool calls in the model's tool-call format, loss on the assistant turns only (``sft_trees_from_messages``).

The warm start says how many tokens the longest reference call has: a rollout whose ``max_tokens`` is below it
cannot reproduce the solution it was trained on (the call is cut, its tool call never parses), which is why the
demo's episodes all scored 0 with 96 tokens per call against reference calls of 174-226 tokens (docs/loop.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import multiprocessing
import shutil
import tempfile
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
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


@dataclass(frozen=True)
class _Options:
    epochs: int
    lr: float
    seed: int
    batch_size: int
    max_tokens: int | None


# Bump when the SFT's code changes what it trains from the same inputs: cached warm starts are then redone.
_CACHE_FORMAT = 1


def _model_identity(model: str) -> dict[str, str]:
    """What the warm start's starting weights are: a preset's name (seeded init), or a checkpoint's digest."""
    from opengyre.models import checkpoint_info, resolve_model

    source = resolve_model(model)
    if source.preset is not None:
        return {"preset": source.preset}
    assert source.checkpoint is not None
    info = checkpoint_info(source.checkpoint)
    return {"checkpoint_sha256": info["sha256"] if info else str(source.checkpoint.resolve())}


def warm_start_digest(model: str, conversations: list[dict[str, Any]], opts: _Options) -> str:
    """The cache key: the starting weights, the reference conversations (their real tool outputs included), and
    every SFT setting that changes the result (``max_tokens`` only warns)."""
    key = {
        "format": _CACHE_FORMAT,
        "model": _model_identity(model),
        "conversations": conversations,
        "epochs": opts.epochs,
        "lr": opts.lr,
        "seed": opts.seed,
        "batch_size": opts.batch_size,
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _train(model: str, conversations: list[dict[str, Any]], out: Path, opts: _Options) -> list[str]:
    """The SFT itself, in a child process (``_sft``); returns the lines to say (a child has no console)."""
    from opengyre.models import model_state, resolve_model
    from opengyre.trainer import Learner, export_checkpoint, run_sft, sft_trees_from_messages
    from opengyre.trainer.algorithms import SFT
    from opengyre.trainer.backends import build_backend

    lines = []
    source = resolve_model(model)
    trees = sft_trees_from_messages(source, conversations, prefix="golden")
    longest = max(len(n.output_ids) for t in trees for n in t.nodes.values())
    if opts.max_tokens is not None and longest > opts.max_tokens:
        lines.append(
            f"[yellow]warm start: the longest reference call has {longest} tokens but rollouts get {opts.max_tokens} "
            "per call: the policy cannot reproduce it (raise max_tokens)[/]"
        )
    weights, _ = source.load(seed=opts.seed)
    backend = build_backend("torch", weights.config, model_state(weights), seed=opts.seed)
    del weights
    learner = Learner(backend, SFT(), lr=opts.lr)
    results = run_sft(learner, trees, epochs=opts.epochs, batch_size=opts.batch_size, seed=opts.seed)
    export_checkpoint(learner.backend, out, SFT_VERSION)
    per_epoch = max(1, -(-len(trees) // opts.batch_size))
    epochs = [results[i : i + per_epoch] for i in range(0, len(results), per_epoch)]
    nll = " -> ".join(f"{sum(r.metrics['nll'] for r in e) / len(e):.3f}" for e in epochs)
    lines.append(
        f"warm start: SFT on {len(trees)} reference solution(s) (longest call {longest} tokens), "
        f"{opts.epochs} epoch(s) of {per_epoch} step(s), lr {opts.lr:g}; nll per epoch {nll}"
    )
    return lines


def _sft(
    model: str,
    tasks: list[TaskRef],
    out: Path,
    opts: _Options,
    say: Callable[[str], None],
    cache: Path | None,
) -> Path:
    from opengyre.harness import agent_tools
    from opengyre.models import checkpoint_info

    out.mkdir(parents=True, exist_ok=True)
    tools = agent_tools("main")  # what the reference harness sends with each call of its main conversation
    conversations = [{"messages": reference_messages(t), "tools": tools} for t in tasks]
    with (out / "reference.jsonl").open("w") as f:
        for c in conversations:
            f.write(json.dumps(c) + "\n")
    digest = warm_start_digest(model, conversations, opts)
    ckpt = (cache / digest) if cache is not None else out / "checkpoint"
    if cache is not None and checkpoint_info(ckpt) is not None:
        say(f"warm start: the same model, reference solutions and settings as before: {ckpt} (no SFT)")
        return ckpt
    # A child process: the SFT's model, optimizer and activations are returned to the system when it exits,
    # instead of staying in this process's heap for the rest of the run.
    tmp = ckpt.with_name(f".{ckpt.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
            lines = pool.submit(_train, model, conversations, tmp, opts).result()
        if cache is None or checkpoint_info(ckpt) is None:  # else an equal run filled the entry meanwhile
            if ckpt.exists():
                shutil.rmtree(ckpt)  # a run's own earlier one, or an incomplete entry: nothing reads it
            tmp.rename(ckpt)  # whole or not at all: a hit is always a complete checkpoint
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for line in lines:
        say(line)
    return ckpt


def sft_warm_start(
    model: str,
    *,
    epochs: int,
    lr: float,
    seed: int = 0,
    batch_size: int = 1,
    max_tokens: int | None = None,
    say: Callable[[str], None] = print,
    cache: Path | None = None,
) -> WarmStart:
    """A ``run_loop`` warm start: SFT of ``model`` on the built tasks' reference solutions.

    ``batch_size`` conversations per optimizer step (1: a step per conversation; with a handful of tasks a larger
    batch is one step per epoch, and the policy does not learn the solutions in a few epochs); ``max_tokens``: the
    rollouts' limit per call, only to warn when a reference call is longer. ``cache``: a folder
    (``<data-dir>/cache/warm-start``) keeping each warm start's checkpoint under the digest of its inputs
    (``warm_start_digest``): the same model, reference solutions and settings again skip the SFT. The SFT runs in
    a child process either way."""
    if epochs < 1 or batch_size < 1 or not lr > 0:
        raise ValueError("sft_warm_start: epochs and batch_size must be >= 1 and lr > 0")
    opts = _Options(epochs, lr, seed, batch_size, max_tokens)

    async def warm(tasks: list[TaskRef], folder: Path) -> Path | None:
        return await asyncio.to_thread(_sft, model, tasks, folder, opts, say, cache)

    return warm
