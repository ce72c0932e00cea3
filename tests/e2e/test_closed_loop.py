"""The closed loop, small: the real embedded stack (every service its own process), two CPU cells with the tiny
model, one task, groups of 4, two steps. The event log must hold the whole story in order.

Deterministic by construction, and honest about it: the harness (``_solver_harness.py``) really talks to the
model through the proxy, but solves by a fixed rule (members m0-m2 of each group run the reference solution, m3
does nothing), because a tiny random model solves nothing. So each group's rewards are [1, 1, 1, noop] with the
no-op below the pass mark (the synth's noop gate): a learning signal for GSPO, and after the two groups the task
version's window of 8 rewards averages at least 0.75, above the hardening projection's default threshold 0.7,
so it is hardened. On-policy (max_lag 0, colocate): step 2 is dispatched only after step 1 is trained and the
engines serve its weights, so step 2's calls carry the new weight version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from opengyre.cli._demo import replay_matches
from opengyre.config import Settings
from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import (
    CellRoleChanged,
    Event,
    ExecutionDispatched,
    ExecutionFinished,
    ModelCallRecorded,
    TaskHardened,
    TaskValidated,
    TrainingStepCompleted,
    WeightsPublished,
)
from opengyre.harness import HarnessSpec, HarnessTarget, run_harness
from opengyre.loop import LoopResult, RunConfig, run_loop
from opengyre.runtime import EmbeddedNats, Stack, free_port
from opengyre.sandbox import SandboxLimits

from ._oracle import INSIDE, oracle_kit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def solver_spec(tmp: Path, data: Path, solved: int, faults: dict[int, str] | None = None) -> HarnessSpec:
    """The scripted oracle for a run of one csv-report task on ``data``, in the default (namespace) sandbox: its
    answers are the test's own copy (``_oracle.py``); the data dir's reference solution it must fail to read."""
    return oracle_kit(tmp, data, ROOT / "svc-synth" / "skills", ["csv-report"]).spec(solved, faults)


async def read_all(log: EventLog) -> list[tuple[int, Event]]:
    return [(s.seq, log.decode(s)) async for s in log.read()]


def own_settings(data: Path, nats_server: EmbeddedNats, log_config: LogConfig) -> Settings:
    """A stack of the test's own: its stream on the session's nats-server (the log outlives the stack), its ports:
    0, each service binds a free one itself and reports it (a port picked here could be taken before it binds)."""
    services = ("synth", "scheduler", "proxy", "trainer", "bench")
    return Settings(
        data_dir=data, nats_url=nats_server.url, log=log_config, ports={s: 0 for s in services}, proxy_http_port=0
    )


@pytest.mark.slow
async def test_the_event_log_tells_the_whole_story_in_order(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    settings = own_settings(data, nats_server, log_config)
    cfg = RunConfig(
        run_id="e2e", skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"], tasks_per_skill=1,
        challenges=1, level=0, model="tiny", cells=2, cell_capacity=2, group_size=4, groups_per_step=1, steps=2,
        policy="colocate", max_lag=0, timeout_s=120, lr=1e-3,
    )  # fmt: skip
    lines: list[str] = []
    replayed: list[bool] = []

    async def replay(stack: Stack, _: LoopResult) -> None:  # what `opengyre demo` ends with
        replayed.append(await replay_matches(stack, settings))

    result = await run_loop(
        cfg, settings, say=lines.append, spec=solver_spec(tmp_path, data, solved=3), before_stop=replay
    )
    said = "\n".join(lines)
    assert len(result.finished) == 8 and len(result.steps) == 2, said
    assert replayed == [True]  # every projection rebuilt from the log equals the live one

    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = await read_all(log)
    finally:
        await log.close()

    def first(kind: type[Event], pred: object = None) -> int:
        return next(i for i, (_, e) in enumerate(events) if isinstance(e, kind) and (pred is None or pred(e)))  # type: ignore[operator]

    validated = first(TaskValidated, lambda e: e.ok)
    dispatched = [e for _, e in events if isinstance(e, ExecutionDispatched)]
    finished = {e.execution_id: e for _, e in events if isinstance(e, ExecutionFinished)}
    # Every execution the scheduler dispatched (on a registered cell, for its step) finished with a real score.
    assert len(dispatched) == 8 and {e.cell_id for e in dispatched} == {"e2e-cell0", "e2e-cell1"}, said
    assert sorted(e.step for e in dispatched) == [1, 1, 1, 1, 2, 2, 2, 2]
    assert set(finished) == {e.execution_id for e in dispatched}
    scores = {eid: f.score for eid, f in finished.items()}
    # m0-m2 solved with the answers the test handed the oracle; had its sandbox let it read the data dir's
    # reference solution (its probe), it would have solved nothing (tests/e2e/_solver_harness.py).
    assert all(scores[f"e2e-s{s}-g0-m{i}"] == 1.0 for s in (1, 2) for i in range(3)), scores
    assert {f.sandbox for f in finished.values()} == {"namespace"}  # every execution says what isolated it
    assert all((scores[f"e2e-s{s}-g0-m3"] or 0.0) < 1.0 for s in (1, 2)), scores
    assert all(scores[f"e2e-s{s}-g0-m3"] is not None for s in (1, 2)), scores
    assert validated < first(ExecutionDispatched)
    # Cells switched: the colocate policy sent the pool to training once step 1's batch was in, and back.
    to_training = first(CellRoleChanged, lambda e: e.to_role.startswith("training"))
    back = first(CellRoleChanged, lambda e: e.from_role == "switching" and e.to_role == "rollout")
    step1 = first(TrainingStepCompleted, lambda e: e.step == 1)
    published = first(WeightsPublished, lambda e: e.step == 1)
    last_of_step1 = max(first(ExecutionFinished, lambda e, x=x: e.execution_id == x) for x in scores if "-s1-" in x)
    story = "\n".join(
        f"{i} {type(e).__name__} {getattr(e, 'execution_id', '')}{getattr(e, 'cell_id', '')} "
        f"{getattr(e, 'from_role', '')}->{getattr(e, 'to_role', '')} {getattr(e, 'reason', '')}"
        for i, (_, e) in enumerate(events)
        if isinstance(e, (ExecutionDispatched, ExecutionFinished, CellRoleChanged, TrainingStepCompleted))
    )  # what the scheduler saw, in order: a failure here says which decision came early
    assert last_of_step1 < to_training < step1 < published < back, f"{said}\n{story}"
    step_event = events[step1][1]
    assert isinstance(step_event, TrainingStepCompleted) and step_event.n_samples > 0
    assert sorted(step_event.execution_ids) == sorted(x for x in scores if "-s1-" in x)
    version = events[published][1].weight_version  # type: ignore[attr-defined]
    assert version == "e2e-s1"
    # Calls of step 1 ran on the starting weights, every call of step 2 on the published ones.
    calls = [(i, e) for i, (_, e) in enumerate(events) if isinstance(e, ModelCallRecorded)]
    assert {e.weight_version for _, e in calls if "-s1-" in e.execution_id} == {"default"}
    step2 = [(i, e) for i, e in calls if "-s2-" in e.execution_id]
    assert step2 and {e.weight_version for _, e in step2} == {version}
    assert all(i > published for i, _ in step2)
    # Each execution was sealed before it was scored: its finish carries the count of its calls, all in the log before it.
    for eid, fin in finished.items():
        mine = [i for i, e in calls if e.execution_id == eid]
        assert fin.recorded_calls == len(mine), (eid, fin.recorded_calls, len(mine))
        assert all(i < first(ExecutionFinished, lambda e, x=eid: e.execution_id == x) for i in mine), eid
    # Step 2 trained too, and the task version that got easy was hardened, after the rewards that made it easy.
    assert first(TrainingStepCompleted, lambda e: e.step == 2) > min(i for i, _ in step2)
    hardened = first(TaskHardened)
    assert hardened > max(first(ExecutionFinished, lambda e, x=x: e.execution_id == x) for x in scores)
    h = events[hardened][1]
    assert isinstance(h, TaskHardened) and (h.from_version, h.to_version) == (1, 2)
    assert result.hardened == 1, said


@pytest.mark.slow
async def test_a_harness_that_crashes_hangs_or_writes_garbage_ends_with_its_class_and_the_run_goes_on(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    cfg = RunConfig(
        run_id="faults", skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"], tasks_per_skill=1,
        model="tiny", cells=2, cell_capacity=2, group_size=4, groups_per_step=1, steps=1, policy="colocate",
        max_lag=0, timeout_s=45, lr=1e-3,
    )  # fmt: skip
    spec = solver_spec(tmp_path, data, solved=1, faults={1: "crash", 2: "hang", 3: "garbage"})
    lines: list[str] = []
    result = await run_loop(cfg, own_settings(data, nats_server, log_config), say=lines.append, spec=spec)
    said = "\n".join(lines)
    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = [e for _, e in await read_all(log)]
    finally:
        await log.close()
    fin = {e.execution_id.rsplit("-", 1)[1]: e for e in events if isinstance(e, ExecutionFinished)}
    assert set(fin) == {"m0", "m1", "m2", "m3"}, said
    assert (fin["m0"].status, fin["m0"].score) == ("completed", 1.0)
    # A crash is graded on what it left (not infrastructure: its own exit status, not a SIGKILL from outside).
    assert (fin["m1"].status, fin["m1"].exit_code, fin["m1"].failure_class) == ("completed", 3, None)
    assert fin["m1"].score is not None and fin["m1"].score < 1.0
    # A hang is killed at the execution's time limit and its workspace graded as it stands.
    assert fin["m2"].status == "timed-out" and fin["m2"].score is not None and fin["m2"].score < 1.0
    # Garbage in the workspace and the summary file: graded (0), the grader is not thrown.
    assert fin["m3"].status == "completed" and fin["m3"].score is not None and fin["m3"].score < 1.0
    finish = {f.assignment.execution_id.rsplit("-", 1)[1]: f.finish_reason for f in result.finished}
    assert finish == {"m0": "exited", "m1": "crashed", "m2": "timeout", "m3": "exited"}, said
    # The run went on: the group trained, every member consumed once.
    steps = [e for e in events if isinstance(e, TrainingStepCompleted)]
    assert len(steps) == 1 and sorted([*steps[0].execution_ids, *steps[0].dropped]) == sorted(
        f"faults-s1-g0-m{i}" for i in range(4)
    ), said


@pytest.mark.slow
async def test_a_service_killed_mid_run_is_restarted_and_nothing_is_lost_or_trained_twice(
    nats_server: EmbeddedNats, log_config: LogConfig, tmp_path: Path
) -> None:
    data = tmp_path / "og"
    cfg = RunConfig(
        run_id="kill", skills=str(ROOT / "svc-synth" / "skills"), skill_names=["csv-report"], tasks_per_skill=1,
        model="tiny", cells=2, cell_capacity=2, group_size=4, groups_per_step=1, steps=2, policy="colocate",
        max_lag=0, timeout_s=120, lr=1e-3,
    )  # fmt: skip
    killed: list[int] = []
    later: list[int] = []  # the trainer's pid when a step was reported
    lines: list[str] = []

    def trainer_pid() -> int:
        return int(json.loads((data / "stack.json").read_text())["services"]["trainer"]["pid"])

    def say(line: str) -> None:
        lines.append(line)
        if line.startswith("dispatch: step 1") and not killed:
            # The trainer dies with step 1's executions running: their outcomes and the step must survive it.
            killed.append(trainer_pid())
            os.kill(killed[0], signal.SIGKILL)
        elif line.startswith("step "):
            later.append(trainer_pid())

    result = await run_loop(
        cfg, own_settings(data, nats_server, log_config), say=say, spec=solver_spec(tmp_path, data, solved=3)
    )
    said = "\n".join(lines)
    assert killed and len(result.finished) == 8 and len(result.steps) == 2, said
    log = await EventLog.connect(nats_server.url, log_config)
    try:
        events = [e for _, e in await read_all(log)]
    finally:
        await log.close()
    dispatched = [e.execution_id for e in events if isinstance(e, ExecutionDispatched)]
    finished = [e.execution_id for e in events if isinstance(e, ExecutionFinished)]
    steps = [e for e in events if isinstance(e, TrainingStepCompleted)]
    consumed = [x for s in steps for x in (*s.execution_ids, *s.dropped)]
    assert sorted(dispatched) == sorted(finished) == sorted(consumed), said  # each once: none lost, none doubled
    assert [s.step for s in steps] == [1, 2]
    assert [e.step for e in events if isinstance(e, WeightsPublished)] == [1, 2]
    assert later and killed[0] not in later  # the supervisor restarted it; the new process trained


def test_the_oracle_gets_its_answers_from_the_test_and_cannot_read_the_data_dir(tmp_path: Path) -> None:
    """The oracle's probe of the data dir's reference solution can fail: on the host it reads it and refuses to
    solve (so a loop test's rewards fail should the sandbox let it through); in the default sandbox it cannot."""
    data = tmp_path / "og"
    kit = oracle_kit(tmp_path, data, ROOT / "svc-synth" / "skills", ["csv-report"])
    [probe] = kit.probes
    probe.parent.mkdir(parents=True)
    probe.write_text("the data dir's reference solution\n")  # where the run's synth will write it
    [answer] = (kit.root / "answers").iterdir()
    assert (answer / "solve.sh").is_file()
    ws = tmp_path / "ws"
    ws.mkdir()
    instruction = tmp_path / "instruction.md"
    instruction.write_text("do it")
    argv = [
        a.format(python=sys.executable, model="tiny", instruction_file=instruction, summary_file=tmp_path / "s.json")
        for a in kit.argv(solved=1)
    ]
    on_host = [a.replace(INSIDE, str(kit.root)) for a in argv]
    nowhere = f"http://127.0.0.1:{free_port()}/x/probe-m0/v1"  # no model there: the oracle stops at its first call
    env = {**os.environ, "OPENAI_BASE_URL": nowhere, "OPENAI_API_KEY": "k"}
    host = subprocess.run(on_host, cwd=ws, env=env, capture_output=True, text=True, check=False)
    assert host.returncode == 9 and "ISOLATION BROKEN" in host.stderr, host
    target = HarnessTarget(nowhere, "k", "tiny", ws, "do it")
    inside = run_harness(kit.spec(solved=1), target, SandboxLimits(timeout_s=120))
    assert inside.isolation == "namespace"
    assert f"probe {probe}: unreadable (FileNotFoundError)" in inside.stdout, (inside.stdout, inside.stderr)
    assert inside.exit_code not in (0, 9)  # it went on to the model, which is not there
