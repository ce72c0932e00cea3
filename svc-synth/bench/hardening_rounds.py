"""Hardening works: a fixed solver's full-score rate on a paired task set falls round after round, turns grow.

The solver is ``ShortcutSolver`` (the scripted agent that takes the shortcuts a weak model takes: it reads the
first evidence file and persists past it with a probability that falls with the level). Each round every task's
current version is run ``--runs`` times; the runs are recorded on a real event log as the scheduler and the
proxy record them (execution-dispatched, model-call-recorded with the tool calls, execution-finished); the
hardening projection folds them, and every version whose windowed mean reward exceeds 0.7 is diagnosed,
raised and re-validated by svc-synth's pipeline before the next round. The baseline in the same process is
round 0 (the set as synthesized). The same tasks are measured every round (paired: task identity is fixed).

    .venv/bin/python svc-synth/bench/hardening_rounds.py [--tasks 12] [--runs 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
from pathlib import Path

from opengyre.eventlog import EventLog, LogConfig
from opengyre.events import Event, ExecutionDispatched, ExecutionFinished, ModelCallRecorded, ToolCallPayload
from opengyre.projection import replay_into
from opengyre.runtime import EmbeddedNats
from opengyre.store import create_db_engine, migrate
from opengyre.synth import GateLimits, HardeningProjection, ShortcutSolver, Synthesizer, TasksProjection, ingest

EXAMPLES = Path(__file__).parents[1] / "skills"


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        nats = EmbeddedNats(root / "nats")
        nats.start()
        log = await EventLog.connect(nats.url, LogConfig(stream="SYNTHBENCH", prefix="sb.ev"))
        engine = create_db_engine(f"sqlite:///{root / 'synth.db'}")
        migrate(engine)
        projections = [TasksProjection(), HardeningProjection(window=args.runs, threshold=0.7)]
        hardening = projections[1]
        assert isinstance(hardening, HardeningProjection)

        async def fold() -> None:
            for p in projections:
                await replay_into(p, log, engine)

        synth = Synthesizer(root / "store", GateLimits(hang_timeout_s=1.0), workers=4)
        skills = ingest(EXAMPLES, root / "skills").accepted
        jobs = [(skills[i % len(skills)], 500 + i) for i in range(args.tasks)]
        builds = await asyncio.to_thread(synth.synthesize_many, jobs)
        current = {b.blueprint.task_id: (b.blueprint.version, b.task_dir) for b in builds if b.ok}
        await log.append_many([e for b in builds for e in b.events])
        solver = ShortcutSolver()
        base: tuple[float, float] | None = None
        print(f"{len(current)} paired tasks, {args.runs} runs per task per round, window {args.runs}, threshold 0.7")
        for rnd in range(args.rounds):
            events: list[Event] = []
            scores, turns = [], []
            for task_id, (version, task_dir) in sorted(current.items()):
                for r in range(args.runs):
                    run = await asyncio.to_thread(solver.solve, task_dir, f"{task_id}/{version}/{rnd}/{r}")
                    ex = f"x{rnd}-{r}-{task_id}"[:120]
                    score = run.outcome.score if run.outcome.score is not None else 0.0
                    scores.append(score)
                    turns.append(run.turns)
                    events.append(
                        ExecutionDispatched(
                            execution_id=ex, task_id=task_id, group_id=f"{task_id}-{rnd}", task_version=version
                        )
                    )
                    events += [
                        ModelCallRecorded(
                            execution_id=ex,
                            call_id=f"{ex}-{k}",
                            tool_calls=[ToolCallPayload(id=str(k), name="bash", arguments=a)],
                        )
                        for k, a in enumerate(run.actions)
                    ]
                    events.append(ExecutionFinished(execution_id=ex, status="completed", score=run.outcome.score))
            await log.append_many(events)
            await fold()
            full = sum(s == 1.0 for s in scores) / len(scores)
            mean_turns = statistics.mean(turns)
            if base is None:
                base = (full, mean_turns)
            hardened = 0
            for task_id, version in synth.pending(engine):
                out = await asyncio.to_thread(synth.harden, engine, task_id, version, hardening)
                await log.append_many(out)
                for e in out:
                    if e.type_name() == "task-hardened":
                        hardened += 1
                        current[task_id] = (version + 1, synth.task_dir(task_id, version + 1))
            await fold()
            print(
                f"round {rnd}: full-score rate {full:.1%} (x{full / base[0]:.2f} of round 0), mean reward "
                f"{statistics.mean(scores):.3f}, mean turns {mean_turns:.2f} (x{mean_turns / base[1]:.2f}); "
                f"{hardened} task(s) hardened after it"
            )
        await log.js.delete_stream("SYNTHBENCH")
        await log.close()
        nats.stop()
        engine.dispose()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=12)
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main(ap.parse_args()))
