"""Start a harness (any ``HarnessSpec``) in the task's sandbox, against one execution of the proxy.

The harness runs in a ``LocalSandbox`` (clean environment, private home and tmp, time and memory limits, its
process group killed at the end) with the workspace as its working directory, so the workspace is preserved
in place for the evaluator. It needs the network: its only way to the model is the proxy's base URL.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opengyre.sandbox import LocalSandbox, SandboxLimits

from ._spec import HarnessSpec

__all__ = ["HarnessOutcome", "HarnessTarget", "run_harness"]

DEFAULT_LIMITS = SandboxLimits(timeout_s=1800.0, memory_mb=8192, network=True)


@dataclass(frozen=True)
class HarnessTarget:
    """What a harness is given: the execution's endpoint and key, the model name, the workspace, the task."""

    base_url: str
    api_key: str
    model: str
    workdir: Path
    instruction: str


@dataclass(frozen=True)
class HarnessOutcome:
    """How the harness ended. ``finish_reason``: the harness's own from its summary file where it wrote a valid
    one (the built-in one: submitted / max-turns / timeout / model-error); else ``timeout`` when the sandbox
    killed it at its time limit, ``exited`` (exit 0) or ``crashed`` (any other exit)."""

    exit_code: int
    finish_reason: str
    summary: dict[str, Any] | None
    timed_out: bool
    stdout: str
    stderr: str
    duration_s: float
    signal: int | None = None  # the signal that ended the harness when no limit of the sandbox did


def _anthropic_base(base_url: str) -> str:
    # The Anthropic SDK appends /v1/messages itself: the execution's root, without the OpenAI /v1.
    return base_url.rstrip("/").removesuffix("/v1")


def _read_summary(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # none written, or garbage: the exit status is all there is
    return data if isinstance(data, dict) and isinstance(data.get("finish_reason"), str) else None


def run_harness(spec: HarnessSpec, target: HarnessTarget, limits: SandboxLimits | None = None) -> HarnessOutcome:
    """Run ``spec`` to its end (blocking; ``asyncio.to_thread`` from async code)."""
    lim = limits or DEFAULT_LIMITS
    if not lim.network:
        raise ValueError("a harness needs the network to reach the proxy: run it with SandboxLimits(network=True)")
    workdir = Path(target.workdir).resolve()
    if not workdir.is_dir():
        raise ValueError(f"the workspace {workdir} is not a directory")
    with LocalSandbox(lim, prefix="og-harness-run-") as sb:
        instruction_file = sb.root / "instruction.md"
        instruction_file.write_text(target.instruction)
        summary_file = sb.root / "harness-summary.json"
        argv, env = spec.render(
            {
                "base_url": target.base_url,
                "anthropic_base_url": _anthropic_base(target.base_url),
                "api_key": target.api_key,
                "model": target.model,
                "workdir": str(workdir),
                "instruction": target.instruction,
                "instruction_file": str(instruction_file),
                "summary_file": str(summary_file),
                "python": sys.executable,
            }
        )
        result = sb.run(argv, cwd=workdir, env=env)
        summary = _read_summary(summary_file)
    if summary is not None:
        reason = str(summary["finish_reason"])
    elif result.timed_out:
        reason = "timeout"
    else:
        reason = "exited" if result.exit_code == 0 else "crashed"
    return HarnessOutcome(
        result.exit_code,
        reason,
        summary,
        result.timed_out,
        result.stdout,
        result.stderr,
        result.duration_s,
        result.signal,
    )
