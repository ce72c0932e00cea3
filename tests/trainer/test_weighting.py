"""One weighting rule for batch and streaming steps, and group baselines over what is actually trained.

The same ready groups, from the same weights, through a batch step and a streaming step: the same gradient
(plain SGD makes the weight change the gradient itself). Groups of different sizes and a group without signal
make any per-group share or unused share show."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import ExecutionFinished, ModelCallRecorded
from opengyre.projection import ProjectionRunner
from opengyre.trainer import OnlineTrainer, TrainerConfig, TrainerProjection, TrainerStore

from ._events import catch_up, group


def config(tmp_path: Path, **kw: object) -> TrainerConfig:
    base: dict[str, object] = dict(
        model="tiny", algorithm="grpo", lr=1e-3, checkpoint_dir=tmp_path / "ckpt", micro_batch_tokens=128,
        groups_per_step=3, mini_batches=1, max_grad_norm=None, group_size=2,
    )  # fmt: skip
    base.update(kw)
    return TrainerConfig(**base)  # type: ignore[arg-type]


async def test_streaming_and_batch_steps_give_the_same_gradient(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    await event_log.append_many(
        [
            *group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]),
            *group(
                "g2",
                [
                    ("completed", 1.0, None),
                    ("completed", 0.2, None),
                    ("completed", 0.4, None),
                    ("timed-out", 0.9, None),
                ],
                seed=1,
            ),
            *group("g3", [("completed", 0.5, None), ("completed", 0.5, None)], seed=2),  # no signal
        ]
    )
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    store = TrainerStore(engine)
    deltas, reports = [], []
    for streaming in (False, True):
        # No log: nothing is appended, so the second trainer sees the same ready groups as the first.
        trainer = OnlineTrainer(config(tmp_path / str(streaming), streaming=streaming), store, None)
        trainer.learner.optimizer = torch.optim.SGD(trainer.backend.parameters(), lr=1e-3)
        before = trainer.backend.hf_state_dict()
        report = await trainer.step_once(poll_s=0.01)
        assert report is not None and report.result is not None
        after = trainer.backend.hf_state_dict()
        deltas.append({k: after[k] - before[k] for k in before})
        reports.append(report)
    batch, streamed = reports
    assert sorted(batch.completed.execution_ids) == sorted(streamed.completed.execution_ids)
    assert len(batch.completed.execution_ids) == 6 and batch.completed.dropped["g3-e0"].startswith("no-signal")
    assert streamed.result is not None and batch.result is not None
    assert streamed.result.loss == pytest.approx(batch.result.loss, rel=1e-5, abs=1e-8)
    largest = max(float(d.abs().max()) for d in deltas[0].values())
    assert largest > 0
    for k in deltas[0]:  # float32 weights: a change is exact to about 1e-7 of the weight it is taken from
        torch.testing.assert_close(deltas[1][k], deltas[0][k], rtol=1e-3, atol=1e-3 * largest)


async def test_group_baselines_are_over_the_members_actually_trained(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    events = group("g1", [("completed", 1.0, None), ("completed", 0.0, None), ("completed", 0.3, None),
                          ("completed", 0.8, None)])  # fmt: skip
    finish = events.pop()  # g1-e3 records a corrupt call first: it is dropped after admission's verdicts
    assert isinstance(finish, ExecutionFinished)
    bad = ModelCallRecorded(
        execution_id="g1-e3", call_id="bad", prompt_delta_ids=[1], output_ids=[2, 3], output_logprobs=[-1.0]
    )
    await event_log.append_many([*events, bad, finish])
    await catch_up(ProjectionRunner(TrainerProjection(), event_log, engine))
    report = await OnlineTrainer(
        config(tmp_path, group_size=4, groups_per_step=1), TrainerStore(engine), None
    ).step_once()
    assert report is not None
    assert report.completed.dropped == {"g1-e3": "excluded:rejected:length-mismatch"}
    advantages = {s.execution_id: s.advantage for s in report.prepared.samples}
    assert sorted(advantages) == ["g1-e0", "g1-e1", "g1-e2"]
    assert sum(advantages.values()) == pytest.approx(0.0, abs=1e-9)  # zero-mean over what is trained
    [g] = report.prepared.groups
    assert g.survivors == 3 and g.mean == pytest.approx((1.0 + 0.0 + 0.3) / 3)
