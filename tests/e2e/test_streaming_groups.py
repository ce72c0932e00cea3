"""Streaming across groups: a step's groups go out one by one as the rollout cells have room, not all together.

Two groups of 4 per step on 2 cells of capacity 3 (6 slots): a step's 8 executions never fit at once, so a
driver that dispatched a step's groups together would wait forever. Each group goes out on its own: the first at
once, the second as soon as 4 slots are free again (after some of the first group finished), and both make up
the step the trainer trains.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import ExecutionDispatched, ExecutionFinished, TrainingStepCompleted
from opengyre.loop import RunConfig, run_loop
from opengyre.runtime import EmbeddedNats

from .test_closed_loop import ROOT, own_settings, read_all, solver_spec


@pytest.mark.slow
async def test_a_steps_groups_are_dispatched_as_capacity_frees(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    cfg = RunConfig(
        run_id="stream", skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"], tasks_per_skill=1,
        model="tiny", cells=2, cell_capacity=3, group_size=4, groups_per_step=2, steps=2, policy="colocate",
        max_lag=0, timeout_s=120, lr=1e-3,
    )  # fmt: skip
    lines: list[str] = []
    result = await run_loop(
        cfg, own_settings(data, nats_server, log_config), say=lines.append, spec=solver_spec(tmp_path, data, solved=3)
    )
    said = "\n".join(lines)
    assert len(result.finished) == 16 and len(result.steps) == 2, said
    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = [e for _, e in await read_all(log)]
    finally:
        await log.close()
    at = {(type(e).__name__, e.execution_id): i for i, e in enumerate(events) if hasattr(e, "execution_id")}
    for step in (1, 2):
        g0 = [f"stream-s{step}-g0-m{i}" for i in range(4)]
        g1 = [f"stream-s{step}-g1-m{i}" for i in range(4)]
        first_g1 = min(at["ExecutionDispatched", x] for x in g1)
        # The second group went out once the first had freed slots: after one of its finishes, never before.
        assert first_g1 > min(at["ExecutionFinished", x] for x in g0), said
        assert {
            e.step for e in events if isinstance(e, ExecutionDispatched) and e.group_id.endswith(f"s{step}-g1")
        } == {step}
    # Never more executions running than the cells hold.
    running = peak = 0
    for e in events:
        running += isinstance(e, ExecutionDispatched) - isinstance(e, ExecutionFinished)
        peak = max(peak, running)
    assert peak <= 6, peak
    # Each step trained both of its groups, each execution once.
    steps = [e for e in events if isinstance(e, TrainingStepCompleted)]
    assert [s.step for s in steps] == [1, 2]
    for s in steps:
        consumed = sorted([*s.execution_ids, *s.dropped])
        assert consumed == sorted(f"stream-s{s.step}-g{g}-m{i}" for g in (0, 1) for i in range(4)), said
