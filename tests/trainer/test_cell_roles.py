"""The trainer's satellites follow the cells' roles in the log: role events appended to a real nats-server bring
a satellite process into the running step and take it out again between micro-steps, and the step's update is
the one of a single process over the same data; a satellite SIGKILLed mid-step fails the step."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.events import CellRegistered, CellRole, CellRoleChanged, Event
from opengyre.models import model_config
from opengyre.projection import ProjectionRunner
from opengyre.trainer import (
    Learner,
    MiniBatch,
    OnlineTrainer,
    ProcessSatellite,
    StepReport,
    TrainerConfig,
    TrainerProjection,
    TrainerStore,
    loss_normaliser,
    pack_samples,
)
from opengyre.trainer.algorithms import get_algorithm
from opengyre.trainer.backends import build_backend

from .._polling import await_until
from ._events import folding, group

GROUPS = 8  # the step's groups: the first starts it, the others arrive while satellites come and go
TO_TRAINING: tuple[CellRole, ...] = ("rollout", "draining", "switching")


def moves(cell: str, *roles: CellRole) -> list[Event]:
    """The role changes that walk ``cell`` through ``roles`` (each a step of the protocol)."""
    return [CellRoleChanged(cell_id=cell, from_role=a, to_role=b) for a, b in itertools.pairwise(roles)]


def config(tmp_path: Path) -> TrainerConfig:
    return TrainerConfig(
        model="tiny", algorithm="grpo", lr=1e-3, group_size=2, groups_per_step=GROUPS, checkpoint_dir=tmp_path / "ckpt",
        micro_batch_tokens=128, streaming=True, follow_cell_roles=True, mini_batches=1,
    )  # fmt: skip


def members(i: int) -> list[Event]:
    return group(f"g{i}", [("completed", 1.0, None), ("completed", 0.25 * (i % 4), None)], seed=i)


@dataclass
class Running:
    trainer: OnlineTrainer
    step: asyncio.Task[StepReport | None]
    initial: dict[str, torch.Tensor]
    log: EventLog

    def claims(self, worker: str) -> int:
        buf = self.trainer.streaming_buffer
        return buf.claims.get(worker, 0) if buf is not None else 0

    def satellite(self, cell: str) -> ProcessSatellite | None:
        cells = self.trainer.cells
        return cells.live.get(cell) if cells is not None else None

    async def join(self, cell: str) -> ProcessSatellite:
        """The log turns ``cell`` to training-satellite; its process comes up and joins the running step."""
        await self.log.append_many(moves(cell, *TO_TRAINING, "training-satellite"))
        await await_until(lambda: self.satellite(cell) is not None, f"{cell}'s satellite process is up", polls=6000)
        sat = self.satellite(cell)
        assert sat is not None
        await await_until(lambda: bool(sat.joined_digest), f"{cell} joined the running step with the core's weights")
        return sat

    async def feed_until_claimed(self, first: int, cell: str, more_than: int = 0) -> int:
        """Append groups one at a time from ``first``, each one's micro-batches all claimed before the next,
        until ``cell`` has claimed more than ``more_than``; returns the next group's number."""
        buf = self.trainer.streaming_buffer
        assert buf is not None
        i = first
        while self.claims(cell) <= more_than and i < GROUPS:
            before = buf.produced

            def claimed(before: int = before) -> bool:
                return buf.produced > before and sum(buf.claims.values()) == buf.produced

            await self.log.append_many(members(i))
            i += 1
            await await_until(claimed, f"group g{i - 1}'s micro-batches were claimed", polls=4000)
        assert self.claims(cell) > more_than, f"{cell} claimed {more_than} or fewer of {buf.produced} micro-batches"
        return i


@pytest.fixture
async def running(event_log: EventLog, engine: Engine, tmp_path: Path) -> AsyncIterator[Running]:
    """A trainer following the roles, its step started on g1 with c1 the core and c2 still in rollout."""
    await event_log.append_many(
        [CellRegistered(cell_id="c1"), CellRegistered(cell_id="c2"), *moves("c1", *TO_TRAINING, "training-core")]
    )
    await event_log.append_many(members(0))
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        await runner.wait_caught_up(60)
        trainer = OnlineTrainer(config(tmp_path), TrainerStore(engine), event_log)
        initial = trainer.backend.hf_state_dict()
        step = asyncio.create_task(trainer.step_once(poll_s=0.05))
        r = Running(trainer, step, initial, event_log)
        try:
            await await_until(lambda: r.claims("core") >= 1, "the core took g0's first micro-batch", polls=2400)
            yield r
        finally:
            if not step.done():
                step.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # the test saw what it raised
                await step
            trainer.close()


def one_process(r: Running, report: StepReport) -> tuple[float, dict[str, torch.Tensor]]:
    """The same samples from the same weights, trained by one process in one batch step."""
    cfg = r.trainer.config
    backend = build_backend("torch", model_config("tiny"), r.initial)
    algorithm = get_algorithm(cfg.algorithm, **cfg.algorithm_params)
    learner = Learner(backend, algorithm, lr=cfg.lr, weight_decay=cfg.weight_decay, max_grad_norm=cfg.max_grad_norm)
    samples = report.prepared.samples
    norm = loss_normaliser(samples, r.trainer.aggregation, cfg.loss_norm_tokens)
    result = learner.step([MiniBatch(pack_samples(samples, cfg.micro_batch_tokens), norm)], cfg.ppo_epochs)
    return result.loss, backend.hf_state_dict()


async def test_role_events_bring_a_satellite_into_the_running_step_and_take_it_out_with_the_same_update(
    running: Running,
) -> None:
    r = running
    # c2 turns to training: the log says so, and the trainer starts its satellite process mid-step.
    sat = await r.join("c2")
    assert not r.step.done()  # the step is still waiting for its groups: c2 joined it mid-batch
    nxt = await r.feed_until_claimed(1, "c2")
    assert nxt < GROUPS, "c2 claimed only with the last group: no group left to arrive after it leaves"
    # c2 goes back: it leaves between micro-steps, its process ends, and the step goes on without it.
    await r.log.append_many(moves("c2", "training-satellite", "switching"))
    cells = r.trainer.cells
    assert cells is not None
    await await_until(lambda: "c2" in cells.left, "c2's satellite left and its process was closed", polls=2400)
    assert sat.proc.poll() is not None and not r.step.done()
    did = r.claims("c2")
    for i in range(nxt, GROUPS):
        await r.log.append_many(members(i))
    report = await r.step
    assert report is not None and report.result is not None
    buf = r.trainer.streaming_buffer
    assert buf is not None
    assert r.claims("c2") == did == len(sat.results)  # nothing after it left; everything it claimed, it did
    # nothing dropped, nothing twice: each micro-batch claimed once, trained once per epoch
    assert buf.produced == sum(buf.claims.values())
    assert report.result.micro_steps == buf.produced * r.trainer.config.ppo_epochs
    assert len(report.completed.execution_ids) == 2 * GROUPS
    loss, want = one_process(r, report)
    assert report.result.loss == pytest.approx(loss, rel=1e-4, abs=1e-7)
    got = r.trainer.backend.hf_state_dict()
    for k in want:  # after Adam's first update (see test_cell_process)
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)


async def test_a_cell_that_leaves_and_comes_back_joins_the_same_step_again_with_a_new_process(
    running: Running,
) -> None:
    r = running
    cells = r.trainer.cells
    assert cells is not None
    await r.log.append_many(moves("c2", *TO_TRAINING, "training-satellite"))
    await await_until(lambda: r.satellite("c2") is not None, "c2's satellite process is up", polls=6000, every=0.05)
    first = r.satellite("c2")
    nxt = await r.feed_until_claimed(1, "c2")
    await r.log.append_many(moves("c2", "training-satellite", "switching", "rollout"))
    await await_until(lambda: "c2" in cells.left, "c2's first satellite left", polls=2400)
    did = r.claims("c2")
    await r.log.append_many(moves("c2", *TO_TRAINING, "training-satellite"))
    await await_until(
        lambda: r.satellite("c2") not in (None, first), "c2's second satellite process is up", polls=6000, every=0.05
    )
    second = r.satellite("c2")
    assert second is not None and first is not None
    await await_until(lambda: bool(second.joined_digest), "c2 joined the same step again")
    assert not r.step.done() and second.joined_digest == first.joined_digest  # the same step-start weights
    nxt = await r.feed_until_claimed(nxt, "c2", more_than=did)
    for i in range(nxt, GROUPS):
        await r.log.append_many(members(i))
    report = await r.step
    assert report is not None and report.result is not None
    assert len(first.results) + len(second.results) == r.claims("c2") and len(second.results) >= 1
    loss, want = one_process(r, report)
    assert report.result.loss == pytest.approx(loss, rel=1e-4, abs=1e-7)
    got = r.trainer.backend.hf_state_dict()
    for k in want:
        torch.testing.assert_close(got[k], want[k], rtol=1e-4, atol=1e-4)


async def test_a_satellite_sigkilled_mid_step_fails_the_step(running: Running) -> None:
    r = running
    sat = await r.join("c2")
    nxt = await r.feed_until_claimed(1, "c2")
    sat.proc.kill()
    sat.proc.wait()
    for i in range(nxt, GROUPS):
        await r.log.append_many(members(i))
    # the update is not applied with the dead cell's gradients missing: the step fails, saying why
    with pytest.raises(RuntimeError, match="a satellite failed"):
        await r.step
    assert r.trainer.step_no == 0  # no step was recorded


async def test_no_step_starts_while_no_cell_is_training_core(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    await event_log.append_many([CellRegistered(cell_id="c1"), *members(0)])
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        await runner.wait_caught_up(60)
        trainer = OnlineTrainer(config(tmp_path), TrainerStore(engine), event_log)
        try:
            assert trainer.ready()  # the data is there
            assert await trainer.step_once(poll_s=0.05) is None and trainer.streaming_buffer is None
        finally:
            trainer.close()


def test_following_roles_needs_streaming_and_no_fixed_satellites(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="follow_cell_roles"):
        TrainerConfig(model="tiny", follow_cell_roles=True).validate()
    with pytest.raises(ValueError, match="follow_cell_roles"):
        TrainerConfig(model="tiny", follow_cell_roles=True, streaming=True, mini_batches=1, satellites=1).validate()
