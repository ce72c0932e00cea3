"""The online trainer over a real log: failures never reach the loss, each execution is consumed once, a
checkpoint is published, and the published weights give exactly the trainer's logprobs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import ExecutionDispatched, ExecutionFinished, ModelCallRecorded, WeightsPublished
from opengyre.models import load_checkpoint, model_config, token_logprobs
from opengyre.projection import ProjectionRunner
from opengyre.trainer import (
    OnlineTrainer,
    TrainerConfig,
    TrainerProjection,
    TrainerStore,
    export_checkpoint,
    loss_normaliser,
    pack_samples,
)
from opengyre.trainer.backends import build_backend

from .._polling import await_until
from ._events import catch_up, folding, group


def config(tmp_path: Path, **kw: object) -> TrainerConfig:
    base: dict[str, object] = dict(
        model="tiny", algorithm="grpo", lr=1e-3, group_size=4, checkpoint_dir=tmp_path / "ckpt", micro_batch_tokens=128
    )
    base.update(kw)
    return TrainerConfig(**base)  # type: ignore[arg-type]


async def test_failures_never_reach_the_loss_and_nothing_trains_twice(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    outcomes = [
        ("completed", 1.0, None),
        ("timed-out", 0.5, None),  # graded partial work: trained with its score
        ("completed", 0.0, None),  # a valid zero: trained
        ("evaluator-failed", None, "evaluator"),
        ("infra-failed", None, "oom"),
        ("completed", 0.2, "sandbox"),  # infra trouble despite a score: masked
    ]
    # A seventh member finished with a score but its trajectory never reached the log (truncated): no tree.
    lost = [
        ExecutionDispatched(execution_id="g1-e6", task_id="task-g1", group_id="g1", group_size=7),
        ExecutionFinished(execution_id="g1-e6", status="completed", score=0.9),
    ]
    await event_log.append_many([*group("g1", outcomes), *lost])
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        store = TrainerStore(engine)
        trainer = OnlineTrainer(config(tmp_path, group_size=7), store, event_log)
        report = await trainer.step_once()
        await runner.wait_caught_up(60)
    assert report is not None and report.result is not None
    assert sorted(report.completed.execution_ids) == ["g1-e0", "g1-e1", "g1-e2"]
    assert report.completed.dropped == {
        "g1-e3": "excluded:evaluator-failure",
        "g1-e4": "masked:infra:oom",
        "g1-e5": "masked:infra:sandbox",
        "g1-e6": "excluded:corrupt-trajectory:execution g1-e6 has no recorded calls",
    }
    assert {s.execution_id for s in report.prepared.samples} == {"g1-e0", "g1-e1", "g1-e2"}
    # execution-mean: each execution's targets weigh 1 in all, the step divides by the 3 trained executions
    assert sum(s.token_weight * s.n_targets for s in report.prepared.samples) == pytest.approx(3.0)
    assert loss_normaliser(report.prepared.samples, "execution-mean") == 3.0
    assert report.completed.metrics["reward_mean"] == pytest.approx(0.5)
    # the live cost of bounded sampling: 3 trained executions x 4 path ends each (3 leaves, and c1, whose output
    # the summary c3 forked inside), J = 5 draws them all here: every generated token is a target once
    m = report.completed.metrics
    assert (m["paths"], m["leaves"]) == (12.0, 12.0) and m["forward_tokens"] == m["all_paths_forward_tokens"] > 0
    assert m["targets"] == m["generated_tokens"] == 3 * 30
    assert report.published is not None and report.checkpoint is not None
    assert report.published.weight_version == "default-s1" and Path(report.published.uri).is_dir()
    assert store.ready_groups(6) == []
    assert await trainer.step_once() is None  # consumed: never trained twice
    for eid in ("g1-e0", "g1-e3", "g1-e4"):
        row = store.execution(eid)
        assert row is not None and row["consumed_step"] == 1
    assert store.version_steps() == {"default-s1": 1}

    # Train/inference consistency: the published checkpoint, loaded the way the CPU engine loads it,
    # gives exactly the trainer's logprobs for the same tokens.
    model, version = load_checkpoint(report.checkpoint.path)
    assert version == "default-s1"
    mb = pack_samples(report.prepared.samples, 10_000)[0]
    with torch.no_grad():
        trainer.backend.model.eval()  # type: ignore[attr-defined]
        ours = trainer.backend.token_logprobs(mb)
        theirs = token_logprobs(model, mb.input_ids)
    assert torch.equal(ours[mb.mask], theirs[mb.mask])


async def test_staleness_from_version_stamps_and_corrupt_trajectories(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    events = [
        WeightsPublished(weight_version="default-s1", step=1, uri=str(tmp_path / "s1"), digest=""),
        WeightsPublished(weight_version="default-s2", step=2, uri=str(tmp_path / "s2"), digest=""),
        *group("g1", [("completed", 1.0, None), ("completed", 0.0, None), ("completed", 0.5, None)], "default-s1"),
    ]
    # g1-e2 also gets a corrupt call (mismatched lengths): the whole execution must stay out of the loss.
    events.append(
        ModelCallRecorded(
            execution_id="g1-e2", call_id="bad", prompt_delta_ids=[1], output_ids=[2, 3], output_logprobs=[-1.0]
        )
    )
    # move g1-e2's finish after the corrupt call
    fin = next(
        e for e in events if getattr(e, "execution_id", None) == "g1-e2" and e.type_name() == "execution-finished"
    )
    events.remove(fin)
    events.append(fin)
    await event_log.append_many(events)
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    for name in ("s1", "s2"):  # the run's published checkpoints: a new trainer resumes from the latest
        export_checkpoint(build_backend("torch", model_config("tiny"), seed=7), tmp_path / name, f"default-{name}")
    store = TrainerStore(engine)
    trainer = OnlineTrainer(config(tmp_path, group_size=3, max_staleness=2), store, event_log)
    assert trainer.resumed_from == "default-s2"
    resumed = load_checkpoint(tmp_path / "s2")[0].state_dict()
    assert all(torch.equal(v, resumed[k]) for k, v in trainer.backend.hf_state_dict().items())
    trainer.step_no = 3  # the trainer is about to produce step 4 from step-3 weights; data came from step 1
    report = await trainer.step_once()
    assert report is not None
    assert report.completed.dropped == {"g1-e2": "excluded:rejected:length-mismatch"}
    assert report.completed.staleness_max == 2 and report.completed.staleness_mean == 2.0


@pytest.mark.parametrize("processes", [False, True], ids=["thread-satellite", "process-satellite"])
async def test_streaming_step_trains_while_groups_arrive_with_a_satellite(
    event_log: EventLog, engine: Engine, tmp_path: Path, processes: bool
) -> None:
    import asyncio

    from opengyre.trainer import Learner, MiniBatch
    from opengyre.trainer.algorithms import GRPO

    runner = ProjectionRunner(TrainerProjection(), event_log, engine)
    stop = asyncio.Event()
    fold = asyncio.create_task(runner.run(stop))
    trainer: OnlineTrainer | None = None
    try:
        await event_log.append_many(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]))
        await runner.wait_caught_up(60)
        cfg = config(
            tmp_path,
            group_size=2,
            groups_per_step=2,
            streaming=True,
            satellites=1,
            satellite_processes=processes,
            mini_batches=1,
        )
        trainer = OnlineTrainer(cfg, TrainerStore(engine), event_log)
        initial = trainer.backend.hf_state_dict()
        step = asyncio.create_task(trainer.step_once(poll_s=0.05))

        def trains_on_g1() -> bool:
            buf = trainer.streaming_buffer
            return buf is not None and sum(buf.claims.values()) >= 1

        await await_until(trains_on_g1, "the step started on g1: a learner took its first micro-batch", polls=2400)
        assert not step.done()  # and waits for the step's second group
        await event_log.append_many(group("g2", [("timed-out", 0.25, None), ("completed", 0.75, None)], seed=1))
        report = await asyncio.wait_for(step, 120)
    finally:
        stop.set()
        await fold
        if trainer is not None:
            trainer.close()  # a satellite process leaves
    assert report is not None and report.result is not None
    assert sorted(report.completed.execution_ids) == ["g1-e0", "g1-e1", "g2-e0", "g2-e1"]
    # each execution weighs the same, whatever its number of paths (the batch step's rule): 1 each, over 4
    by_execution = dict.fromkeys(report.completed.execution_ids, 0.0)
    for s in report.prepared.samples:
        by_execution[s.execution_id] += s.token_weight * s.n_targets
    assert by_execution == dict.fromkeys(by_execution, pytest.approx(1.0))
    assert report.result.micro_steps >= 2  # at least one micro-batch per group, claimed by core or satellite
    assert trainer.satellites[0].joined_digest  # the satellite joined the step with the core's weights
    # the same update as one worker over the same samples from the same weights
    ref_backend = build_backend("torch", model_config("tiny"), initial)
    ref = Learner(ref_backend, GRPO(), lr=1e-3).step(
        [MiniBatch(pack_samples(report.prepared.samples, 128), 4.0)], cfg.ppo_epochs
    )
    assert report.result.loss == pytest.approx(ref.loss, rel=1e-4, abs=1e-7)
    got, want = trainer.backend.hf_state_dict(), ref_backend.hf_state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)


async def test_a_restarted_trainer_resumes_weights_and_optimizer(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        await event_log.append_many(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]))
        await runner.wait_caught_up(60)
        first = OnlineTrainer(config(tmp_path, group_size=2), TrainerStore(engine), event_log)
        assert first.resumed_from is None
        assert await first.step_once() is not None
        await runner.wait_caught_up(60)
        again = OnlineTrainer(config(tmp_path, group_size=2), TrainerStore(engine), event_log)
    assert again.resumed_from == "default-s1" and again.step_no == 1
    a, b = first.backend.hf_state_dict(), again.backend.hf_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = first.learner.optimizer.state_dict()["state"], again.learner.optimizer.state_dict()["state"]
    assert sa.keys() == sb.keys() and all(torch.equal(sa[i]["exp_avg"], sb[i]["exp_avg"]) for i in sa)


async def test_kl_to_the_starting_policy_is_wired_in(event_log: EventLog, engine: Engine, tmp_path: Path) -> None:
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        await event_log.append_many(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]))
        await event_log.append_many(group("g2", [("completed", 0.2, None), ("completed", 0.9, None)], seed=2))
        await runner.wait_caught_up(60)
        # one update per step: the first step's KL is measured before the policy moves
        cfg = config(tmp_path, group_size=2, algorithm_params={"kl_beta": 0.5}, mini_batches=1, ppo_epochs=1)
        trainer = OnlineTrainer(cfg, TrainerStore(engine), event_log)
        assert trainer.learner.reference is not None and trainer.learner.reference.parameters() == []
        first = await trainer.step_once()
        second = await trainer.step_once()
    assert first is not None and second is not None
    assert first.completed.metrics["kl"] == 0.0  # the policy still is the reference
    assert second.completed.metrics["kl"] > 0.0  # one update later it has moved away


async def test_long_negative_executions_are_masked(event_log: EventLog, engine: Engine, tmp_path: Path) -> None:
    await event_log.append_many(
        group("g1", [("completed", 1.0, None), ("completed", 0.0, None), ("completed", 0.5, None)])
    )
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    cfg = config(tmp_path, group_size=3, max_negative_tokens=10)  # each tree generated 30 tokens
    report = await OnlineTrainer(cfg, TrainerStore(engine), event_log).step_once()
    assert report is not None
    # g1-e1 is below the group's mean: masked; the baseline is then over the two members trained
    assert report.completed.execution_ids == ["g1-e0", "g1-e2"]
    assert report.completed.dropped == {"g1-e1": "masked:long-negative:30"}
    advantages = {s.execution_id: s.advantage for s in report.prepared.samples}
    assert advantages["g1-e0"] > 0 > advantages["g1-e2"]
    assert advantages["g1-e0"] + advantages["g1-e2"] == pytest.approx(0.0)


async def test_a_token_past_the_vocabulary_is_a_corrupt_trajectory_not_a_failed_step(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    events = group("g1", [("completed", 1.0, None), ("completed", 0.0, None), ("completed", 0.5, None)])
    finish = events.pop()  # g1-e2's finish: it first records a call with a token the model does not have
    assert isinstance(finish, ExecutionFinished) and finish.execution_id == "g1-e2"
    far = ModelCallRecorded(
        execution_id="g1-e2", call_id="far", prompt_delta_ids=[1], output_ids=[5000], output_logprobs=[-1.0]
    )
    await event_log.append_many([*events, far, finish])
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    report = await OnlineTrainer(config(tmp_path, group_size=3), TrainerStore(engine), event_log).step_once()
    assert report is not None and report.result is not None
    assert sorted(report.completed.execution_ids) == ["g1-e0", "g1-e1"]
    assert report.completed.dropped == {"g1-e2": "excluded:corrupt-trajectory:token 5000 past the vocabulary"}


async def test_a_step_completed_but_never_published_is_announced_after_a_restart(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    """The crash between a step's two events: executions consumed, checkpoint on disk, no WeightsPublished."""
    from opengyre.events import TrainingStepCompleted
    from opengyre.trainer._loop import step_event_id
    from opengyre.trainer._publish import write_checkpoint

    cfg = config(tmp_path)
    backend = build_backend("torch", model_config("tiny"), seed=3)
    ckpt = write_checkpoint(backend, cfg.checkpoint_dir, cfg.run_id, 1)  # written before the step's events
    await event_log.append(
        TrainingStepCompleted(
            event_id=step_event_id(cfg.run_id, 1, "completed"),
            run_id=cfg.run_id,
            step=1,
            weight_version=ckpt.weight_version,
            loss=0.5,
            n_samples=4,
            n_tokens=64,
        )
    )
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        await runner.wait_caught_up(60)
        store = TrainerStore(engine)
        assert store.latest_weights() is None
        trainer = OnlineTrainer(cfg, store, event_log)
        assert trainer.resumed_from == ckpt.weight_version  # the restarted run continues from those weights
        assert await trainer.step_once() is None  # nothing to train, but the weights are announced first
        again = OnlineTrainer(cfg, store, event_log)  # a second restart before the projection caught up
        await again.recover()
        await runner.wait_caught_up(60)
        latest = store.latest_weights()
    assert latest is not None and latest.weight_version == ckpt.weight_version and latest.step == 1
    assert latest.digest == ckpt.digest
    published = [s async for s in event_log.read(1) if s.type_name == "weights-published"]
    assert len(published) == 1  # the two recoveries carried one event id: stored once
    ws = event_log.decode(published[0])
    assert isinstance(ws, WeightsPublished) and Path(ws.uri) == ckpt.path


async def test_a_step_with_non_finite_gradients_leaves_the_weights_and_says_so(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    from opengyre.events import TrainingStepCompleted

    await event_log.append_many(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]))
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        trainer = OnlineTrainer(config(tmp_path, group_size=2), TrainerStore(engine), event_log)
        with torch.no_grad():  # an overflowed weight: every gradient through it is NaN
            next(iter(trainer.backend.parameters())).fill_(float("inf"))
        before = {k: v.clone() for k, v in trainer.backend.hf_state_dict().items()}
        report = await trainer.step_once()
        await runner.wait_caught_up(60)
    assert report is not None and report.result is not None
    assert report.checkpoint is None and report.published is None  # nothing new to serve
    after = trainer.backend.hf_state_dict()
    assert all(torch.equal(after[k], before[k]) for k in before)
    stored = [s async for s in event_log.read(1) if s.type_name == "training-step-completed"]
    [event] = [event_log.decode(s) for s in stored]  # decodes: no NaN became a JSON null
    assert isinstance(event, TrainingStepCompleted)
    # two executions: two mini-batches, each update of each PPO epoch skipped
    assert event.metrics["update_skipped"] == 2.0 * trainer.config.ppo_epochs and "grad_norm" not in event.metrics
    assert sorted(event.execution_ids) == ["g1-e0", "g1-e1"]  # consumed once, not retried forever
