"""A pattern that emits a judge item: git-value-origin asks for the reasoning beside the hash, which the sandboxed
grader leaves out and the LLM judge scores (through the real gateway, a scripted engine behind it)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
from pathlib import Path

from opengyre.eventlog import EventLog
from opengyre.synth import build_task, materials, write_task
from tests.libs.grading._judging import judging

from .test_patterns import _one


async def test_the_reasoning_of_a_git_task_is_judged_and_combined_with_its_answer(
    event_log: EventLog, tmp_path: Path
) -> None:
    bp = _one("git-value-origin", {"commits": 10, "decoys": 1, "returns": 1})
    _, m = materials(bp)[0]
    (why,) = [r for r in m.rubric if r.kind == "judge"]
    assert why.file == "why_c0.md" and m.facts["commit"] not in why.criterion  # the judge's prompt is recorded
    assert why.file in m.instruction and m.facts["commit"] not in m.instruction  # asked for; the answer not given
    task = write_task(build_task(bp), tmp_path / "task")
    rubric = json.loads((task / "tests" / "rubric.json").read_text())
    assert [i["kind"] for i in rubric["items"]] == ["json_equals", "judge"]
    ws = tmp_path / "ws"
    shutil.copytree(task / "environment" / "workspace", ws, symlinks=True)
    # The reference solution, as the gates run it (its own code: here outside a sandbox, on a copy).
    subprocess.run(["bash", str(task / "solution" / "solve.sh")], env={**os.environ, "APP_DIR": str(ws)}, check=True)
    assert m.facts["commit"] in (ws / "why_c0.md").read_text()
    async with judging(event_log) as judge:
        judge.engine.replies = ['{"score":0.75,"rationale":"the order of changes is read, the returns not shown"}']
        ev = await asyncio.to_thread(judge.verifier().evaluate, task, ws)
        assert ev.failure_class is None, ev.detail
        assert ev.score == round((1.0 * 1.0 + 0.5 * 0.75) / 1.5, 6)
        assert ev.diagnostics is not None and ev.diagnostics["item.c0.commit"] == 1.0
        assert ev.diagnostics["item.c0.why"] == 0.75
        (prompt,) = judge.engine.prompts
        assert why.criterion in prompt and (ws / "why_c0.md").read_text().strip() in prompt
