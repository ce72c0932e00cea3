"""The closed loop with a real harness in it, unmodified, started from its preset (``harness = "<preset>"`` in the
run configuration): the real embedded stack, one cell whose engine is a scripted SGLang-protocol server (the
stand-in for a GPU engine, given to the run as its ``engines``), one csv-report task, a group of 2, one step.

The scripted policy makes the harness run its own shell tool: the group's first conversation runs the task's
reference solution (the test's own copy, ``_oracle.py``), the second a no-op, so the rewards differ and GSPO
has a signal. The step must have trained on the calls the harness made, as the proxy recorded them: each
execution's calls in the log, continuing one conversation under the main role, counted by the seal in its
``execution-finished``, and both executions in the step. mini-swe-agent and the Agents SDK are dev dependencies
(always here); Claude Code runs where it is installed (``make harnesses``), and is skipped saying so elsewhere.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from opengyre.asgi import HttpServer
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionFinished, ModelCallRecorded, TrainingStepCompleted, WeightsPublished
from opengyre.harness import HarnessNotInstalled, check_installed
from opengyre.loop import RunConfig, run_loop
from opengyre.runtime import EmbeddedNats
from opengyre.trajectory import TrajectoryTree, resolve_calls
from tests.proxy._scripted_sglang import scripted_sglang

from ._oracle import oracle_kit
from .test_closed_loop import ROOT, own_settings, read_all

# Claude Code's step trains on its ~50k-token prompts (the tiny model's byte-level tokenizer): ~15 minutes of two
# cores, so it is an opt-in check (`make harness-check` sets this), not the suite's; the suite says it skipped it.
OPT_IN = "OPENGYRE_HARNESS_CHECK"
OPT_IN_ONLY = {"claude-code"}

RAN = "og-ran-42"  # in a prompt only once a command ran: the command itself says og-ran-$((6*7))

# preset -> (its shell tool, the tool's extra arguments, the command that ends its episode; None: a text reply)
SHELLS: dict[str, tuple[str, dict[str, str], str | None]] = {
    "mini-swe-agent": ("bash", {}, "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"),
    "openai-agents": ("run_shell", {}, None),
    "claude-code": ("Bash", {"description": "run the command"}, None),
}


def _call(name: str, arguments: dict[str, str]) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {json.dumps(arguments)}}}</tool_call>'


def _solve(files: dict[str, str]) -> str:
    """The reference solution's files written where the harness may write, then run on its working directory."""
    out = ['d="${TMPDIR:-/tmp}/og-solution"', 'mkdir -p "$d"']
    for rel, body in sorted(files.items()):
        out.append(f'mkdir -p "$(dirname "$d/{rel}")" && cat > "$d/{rel}" <<\'OGEOF\'\n{body.rstrip()}\nOGEOF')
    out.append('APP_DIR="$PWD" bash "$d/solve.sh"')
    return "\n".join(out)


def policy(harness: str, solutions: dict[str, dict[str, str]]) -> Callable[[str], str]:
    """The scripted model: each conversation's first call with the harness's tools runs a command (every other
    one the task's solution), the call after its output ends the episode; a call without the tools is a helper's."""
    tool, extra, finish = SHELLS[harness]
    firsts = itertools.count()

    def reply(prompt: str) -> str:
        if RAN in prompt:
            return _call(tool, {"command": finish, **extra}) if finish else "Done."
        if f'"name": "{tool}"' not in prompt:
            return "CSV report"
        if next(firsts) % 2:
            command = "true"
        else:
            [files] = [f for instruction, f in solutions.items() if instruction.strip()[:120] in prompt]
            command = _solve(files)
        return _call(tool, {"command": f"{command}; echo og-ran-$((6*7))", **extra})

    return reply


@pytest.mark.slow
@pytest.mark.timeout(1200)  # a whole stack, a harness per member and a training step, on 2 shared cores
@pytest.mark.parametrize("harness", sorted(SHELLS))
async def test_a_step_trains_on_the_calls_a_real_harness_made(
    harness: str, nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    if harness in OPT_IN_ONLY and not os.environ.get(OPT_IN):
        pytest.skip(f"{harness} in the loop is an opt-in check (~15 min on 2 cores): make harness-check")
    try:
        check_installed(harness)
    except HarnessNotInstalled as exc:
        pytest.skip(str(exc))
    data = tmp_path / "og"
    kit = oracle_kit(tmp_path, data, ROOT / "svc-synth" / "skills", ["csv-report"])
    app, prompts = scripted_sglang(policy(harness, kit.solutions), context_length=1 << 18)
    engine = HttpServer(app)
    await engine.start()
    run = "rh-" + harness.replace("-", "")[:8]
    cfg = RunConfig(
        run_id=run, skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"], model="tiny", cells=1,
        cell_capacity=2, group_size=2, steps=1, timeout_s=240, lr=1e-3, harness=harness, engines=[engine.url],
    )  # fmt: skip
    lines: list[str] = []
    try:
        result = await run_loop(cfg, own_settings(data, nats_server, log_config), say=lines.append)
        async with httpx.AsyncClient() as client:
            served = (await client.get(f"{engine.url}/model_info")).json()["weight_version"]
    finally:
        await engine.stop()
    said = "\n".join(lines)
    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = [e for _, e in await read_all(log)]
        calls = await resolve_calls(log, [e for e in events if isinstance(e, ModelCallRecorded)])  # tokens joined
    finally:
        await log.close()

    finished = {e.execution_id: e for e in events if isinstance(e, ExecutionFinished)}
    assert sorted(finished) == [f"{run}-s1-g0-m0", f"{run}-s1-g0-m1"], said
    scores = sorted(f.score for f in finished.values() if f.score is not None)
    details = "\n".join(f"{f.execution_id}: {f.score} {f.detail[-1500:]}" for f in finished.values())
    assert len(scores) == 2 and scores[0] < 1.0 == scores[1], details + said  # solved, and not
    tool = SHELLS[harness][0]
    for eid, fin in finished.items():
        mine = [c for c in calls if c.execution_id == eid]
        assert fin.recorded_calls == len(mine) >= 2, (eid, fin.recorded_calls, len(mine), said)
        mains = [c for c in mine if c.role == "main"]
        # The harness's own shell tool, as the model called it, and the call after its output continues the
        # same conversation (a branch of the tree, not a new root).
        ran = [c for c in mains if any(t.name == tool and "og-ran-" in t.arguments for t in c.tool_calls)]
        assert ran, [(c.role, [t.name for t in c.tool_calls]) for c in mine]
        tree = TrajectoryTree(eid, mine)
        after = [c for c in mains if c.parent_call_id is not None and ran[0].call_id in tree.path(c.call_id)]
        assert after, [(c.call_id, c.parent_call_id, c.role) for c in mine]
        assert {c.role for c in mine} <= {"main", "sub-agent"}, [c.role for c in mine]
    assert any(RAN in p for p in prompts)  # the harness sent its tool's output back
    [step] = [e for e in events if isinstance(e, TrainingStepCompleted)]
    assert sorted(step.execution_ids) == sorted(finished) and step.n_samples >= 2, (step, said)
    assert step.n_tokens > 0 and len(result.steps) == 1 and result.steps[0].n_trained == 2, said
    [published] = [e for e in events if isinstance(e, WeightsPublished)]
    assert served == published.weight_version == f"{run}-s1"  # the trainer reloaded the run's engine
