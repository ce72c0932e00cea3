"""What users of verl / slime / prime-rl expect: loss aggregations and their length bias, DAPO's dynamic sampling
and overlong shaping, IcePop/MIS masking, a clamped k3, a learning-rate schedule, RNG state across a restart,
and every step's figures as events and on Prometheus /metrics."""

from __future__ import annotations

import math
import random
from pathlib import Path

import httpx
import pytest
import torch
from sqlalchemy import Engine

from opengyre.eventlog import EventLog
from opengyre.projection import ProjectionRunner
from opengyre.trainer import (
    AdmissionPolicy,
    ExecutionOutcome,
    GroupInput,
    OnlineTrainer,
    PathSampler,
    TrainerConfig,
    TrainerProjection,
    TrainerStore,
    execution_samples,
    execution_weight,
    loss_normaliser,
    lr_at,
)
from opengyre.trainer.algorithms import GRPO, GSPO, LossInputs, k3

from ._events import folding, group
from ._trees import node
from .test_backends import random_tree


def samples_of(eid: str, seeds: list[int], aggregation: str) -> list:  # type: ignore[type-arg]
    drawn = [p for seed in seeds for p in PathSampler(5).sample(random_tree(seed, eid), random.Random(seed))]
    n = sum(p.n_targets for p in drawn)
    return execution_samples(eid, drawn, 1.0, execution_weight(aggregation, n))  # type: ignore[arg-type]


@pytest.mark.parametrize("aggregation", ["execution-mean", "token-mean", "constant"])
def test_loss_aggregations_and_their_length_bias(aggregation: str) -> None:
    short = samples_of("short", [1], aggregation)
    long = samples_of("long", [2, 3], aggregation)  # about twice the targets
    everything = short + long
    z = loss_normaliser(everything, aggregation, norm_tokens=100)  # type: ignore[arg-type]

    def share(ss: list) -> float:  # type: ignore[type-arg]
        return sum(s.token_weight * s.n_targets for s in ss) / z

    n_short, n_long = sum(s.n_targets for s in short), sum(s.n_targets for s in long)
    if aggregation == "execution-mean":  # each execution the same, whatever its length
        assert share(short) == pytest.approx(0.5) and share(long) == pytest.approx(0.5)
    elif aggregation == "token-mean":  # each token the same: the long execution weighs more
        assert share(long) / share(short) == pytest.approx(n_long / n_short)
        assert share(short) + share(long) == pytest.approx(1.0)
    else:  # Dr. GRPO: every token 1 / (executions x constant length), nothing normalised by length
        assert share(short) == pytest.approx(n_short / (2 * 100)) and share(long) == pytest.approx(n_long / 200)
    with pytest.raises(ValueError):
        TrainerConfig(loss_aggregation="constant").validate()  # needs its constant


def test_overlong_shaping_and_long_negative_masking() -> None:
    policy = AdmissionPolicy(overlong_max_tokens=20, overlong_buffer_tokens=10)
    assert policy.shaped(1.0, 10) == 1.0  # before the buffer
    assert policy.shaped(1.0, 15) == pytest.approx(0.5)  # half way into it
    assert policy.shaped(1.0, 40) == pytest.approx(0.0)  # past the limit: the whole punishment
    outs = [ExecutionOutcome(f"e{i}", "g", "completed", 1.0) for i in range(2)]
    step = policy.admit_step([GroupInput("g", outs)], generated={"e0": 5, "e1": 15})
    a = {x.execution_id: x for x in step.groups[0].admissions}
    assert a["e0"].advantage > 0 > a["e1"].advantage  # the same score; the overlong one is below
    assert a["e1"].reward == pytest.approx(0.5)


def mis_inputs(behaviour_shift: list[float]) -> LossInputs:
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]])
    return LossInputs(
        logprobs=old.clone().requires_grad_(True),
        old_logprobs=old,
        behaviour_logprobs=old - torch.tensor([behaviour_shift]),  # ratio pi_old / pi_behaviour = exp(shift)
        advantages=torch.tensor([1.0]),
        mask=torch.tensor([[True, True, True, True]]),
        token_weights=torch.tensor([[0.25] * 4]),
    )


def test_icepop_masks_tokens_with_extreme_mismatch() -> None:
    x = mis_inputs([0.0, math.log(3.0), math.log(0.25), 0.1])
    out = GRPO(tis_cap=2.0, mis_low=0.5, mis_high=2.5).loss(x)
    out.loss.backward()  # type: ignore[no-untyped-call]
    assert x.logprobs.grad is not None
    g = x.logprobs.grad[0].tolist()
    assert g[1] == 0.0 and g[2] == 0.0 and g[0] != 0.0 and g[3] != 0.0  # ratios 3 and 0.25 are masked
    assert out.metrics["mis_masked_fraction"] == pytest.approx(0.5)
    assert out.metrics["tis_clip_fraction"] == 0.0  # the one ratio above the cap was masked, not truncated
    seq = GSPO(mis_low=0.5, mis_high=2.5).loss(mis_inputs([math.log(4.0)] * 4))  # the whole sequence is off
    assert seq.metrics["mis_masked_fraction"] == 1.0 and float(seq.loss.detach()) == 0.0


def test_k3_is_clamped() -> None:
    lp = torch.tensor([[-30.0, -1.0]])
    ref = torch.tensor([[-0.1, -1.0]])
    kl = k3(lp, ref, torch.tensor([[True, True]]))
    assert float(kl[0, 0]) == 10.0 and float(kl[0, 1]) == 0.0  # exp(29.9) would be 1e13


def test_learning_rate_warmup_and_decay() -> None:
    assert [lr_at(s, 1.0, warmup=4) for s in (1, 2, 4, 9)] == [0.25, 0.5, 1.0, 1.0]
    cos = [lr_at(s, 1.0, warmup=2, schedule="cosine", decay_steps=12, min_ratio=0.1) for s in (2, 7, 12, 30)]
    assert cos == pytest.approx([1.0, 0.55, 0.1, 0.1])
    assert lr_at(7, 1.0, schedule="linear", decay_steps=11) == pytest.approx(1 - 7 / 11)
    with pytest.raises(ValueError):
        TrainerConfig(lr_schedule="cosine").validate()  # needs lr_decay_steps


def config(tmp_path: Path, **kw: object) -> TrainerConfig:
    base: dict[str, object] = dict(
        model="tiny", algorithm="grpo", lr=1e-3, group_size=2, checkpoint_dir=tmp_path / "ckpt", micro_batch_tokens=128
    )
    base.update(kw)
    return TrainerConfig(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", [{"dynamic_sampling": True}, {"algorithm": "dapo"}])  # dapo: from its recipe
async def test_dynamic_sampling_waits_for_groups_with_signal(
    event_log: EventLog, engine: Engine, tmp_path: Path, how: dict[str, object]
) -> None:
    flat = group("g1", [("completed", 0.5, None), ("completed", 0.5, None)])  # no signal
    await event_log.append_many([*flat, *group("g2", [("completed", 1.0, None), ("completed", 0.0, None)], seed=2)])
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        trainer = OnlineTrainer(config(tmp_path, groups_per_step=2, **how), TrainerStore(engine), None)
        assert await trainer.step_once() is None  # two groups are ready but only one has signal: wait
        await event_log.append_many(group("g3", [("completed", 0.0, None), ("completed", 0.7, None)], seed=3))
        await runner.wait_caught_up(60)
        report = await trainer.step_once()
    assert report is not None
    assert sorted(report.completed.execution_ids) == ["g2-e0", "g2-e1", "g3-e0", "g3-e1"]
    assert set(report.completed.dropped) == {"g1-e0", "g1-e1"}  # consumed with the step, as no-signal


async def test_step_figures_reach_the_event_and_metrics_and_rng_survives_a_restart(
    event_log: EventLog, engine: Engine, tmp_path: Path
) -> None:
    await event_log.append_many(group("g1", [("completed", 1.0, None), ("completed", 0.0, None)]))
    async with folding(ProjectionRunner(TrainerProjection(), event_log, engine)) as runner:
        cfg = config(tmp_path, lr_warmup_steps=2)
        trainer = OnlineTrainer(cfg, TrainerStore(engine), event_log)
        port = trainer.serve_metrics(0)
        report = await trainer.step_once()
        assert report is not None
        drawn = torch.rand(4)  # what the process draws next, after the step's checkpoint
        async with httpx.AsyncClient() as c:
            text = (await c.get(f"http://127.0.0.1:{port}/metrics")).text
        trainer.close()
        await runner.wait_caught_up(60)
        torch.manual_seed(12345)  # anything else in between
        again = OnlineTrainer(cfg, TrainerStore(engine), event_log)
    m = report.completed.metrics
    for name in ("entropy", "mismatch_kl", "mismatch_abs_diff", "clip_fraction", "tis_clip_fraction",
                 "mis_masked_fraction", "breaker_trips", "updates"):  # fmt: skip
        assert name in m, name
        assert f'opengyre_trainer_step_metric{{name="{name}",run="default"}}' in text
    assert m["entropy"] > 0 and m["mismatch_kl"] > 0  # behaviour logprobs of these trees are not the model's
    assert m["lr"] == pytest.approx(0.5e-3)  # step 1 of a 2-step warmup
    assert 'opengyre_trainer_executions_total{as="train",run="default"} 2.0' in text
    assert again.resumed_from == "default-s1" and torch.equal(torch.rand(4), drawn)


def test_overlong_filter_masks_executions_cut_at_the_length_limit(tmp_path: Path) -> None:
    from opengyre.trainer import ReadyGroup, prepare_step
    from opengyre.trajectory import TrajectoryTree

    def tree(eid: str) -> TrajectoryTree:
        t = TrajectoryTree(eid)
        t.add(node("r", None, 0, [1, 2, 3], [10, 11, 12]))
        if eid == "cut":
            object.__setattr__(t.node("r"), "finish_reason", "length")
        return t

    outs = tuple(ExecutionOutcome(e, "g", "completed", s) for e, s in (("cut", 1.0), ("a", 0.0), ("b", 0.5)))
    g = ReadyGroup("g", "t", outs, {}, 1, 3)
    kw = dict(policy=AdmissionPolicy(), sampler=PathSampler(5), load_tree=tree, corrupt={}, version_steps={})
    filtered = prepare_step(1, [g], overlong_filter=True, **kw)  # type: ignore[arg-type]
    assert filtered.dropped == {"cut": "masked:overlong"} and sorted(filtered.trained) == ["a", "b"]
    kept = prepare_step(1, [g], **kw)  # type: ignore[arg-type]
    assert sorted(kept.trained) == ["a", "b", "cut"]


def test_truncated_negatives_are_masked_not_trained_as_failures() -> None:
    from opengyre.trainer import ReadyGroup, prepare_step
    from opengyre.trajectory import TrajectoryTree

    def tree(eid: str) -> TrajectoryTree:
        t = TrajectoryTree(eid)
        t.add(node("r", None, 0, [1, 2, 3], [10, 11, 12]))
        if eid.startswith("cut"):
            object.__setattr__(t.node("r"), "finish_reason", "length")
        return t

    scores = (("cut-fail", 0.0), ("cut-win", 1.0), ("a", 1.0), ("b", 0.0), ("c", 1.0))
    g = ReadyGroup("g", "t", tuple(ExecutionOutcome(e, "g", "completed", s) for e, s in scores), {}, 1, 5)
    kw = dict(sampler=PathSampler(5), load_tree=tree, corrupt={}, version_steps={})
    on = prepare_step(1, [g], policy=AdmissionPolicy(mask_truncated_negatives=True), **kw)  # type: ignore[arg-type]
    # The truncated failure is masked; a truncated success is an ordinary member.
    assert on.dropped == {"cut-fail": "masked:truncated-negative"}
    assert sorted(on.trained) == ["a", "b", "c", "cut-win"]
    # The baseline is recomputed over the four trained: rewards 1, 1, 0, 1 -> mean 3/4, sample std 1/2.
    adv = {a.execution_id: a.advantage for a in on.groups[0].admissions}
    assert adv["a"] == pytest.approx(0.25 / (0.5 + 1e-6)) and adv["b"] == pytest.approx(-0.75 / (0.5 + 1e-6))
    off = prepare_step(1, [g], policy=AdmissionPolicy(), **kw)  # type: ignore[arg-type]
    assert not off.dropped and "cut-fail" in off.trained  # without the option: trained as a failure
    with pytest.raises(ValueError, match="negative_weight"):
        AdmissionPolicy(negative_weight=0.0).validate()


def test_global_negative_weight_scales_the_loss_of_every_negative() -> None:
    outs = [ExecutionOutcome(f"e{i}", "g", "completed", s) for i, s in enumerate((1.0, 0.0, 0.0, 1.0))]
    plain = AdmissionPolicy().admit("g", outs)
    weighted = AdmissionPolicy(negative_weight=0.25).admit("g", outs)
    a0 = {a.execution_id: a.advantage for a in plain.admissions}
    a1 = {a.execution_id: a.advantage for a in weighted.admissions}
    # Rewards 1, 0, 0, 1: mean 1/2, sample std 1/sqrt(3); positives keep theirs, negatives get a quarter.
    z = 0.5 / (1 / math.sqrt(3) + 1e-6)
    assert a1["e0"] == a0["e0"] == pytest.approx(z) and a1["e3"] == pytest.approx(z)
    assert a1["e1"] == pytest.approx(-0.25 * z) and a0["e1"] == pytest.approx(-z)
    # The loss, by hand: two sequences of two tokens each, token weights 1/4, ratios exp(+-0.3) at clip 0.2.
    lp = torch.tensor([[-1.0, -2.0], [-1.5, -0.5]])
    old = lp - torch.tensor([[0.3, -0.3], [0.3, -0.3]])
    x = LossInputs(
        logprobs=lp.clone().requires_grad_(True), old_logprobs=old, behaviour_logprobs=old,
        advantages=torch.tensor([a1["e0"], a1["e1"]]), mask=torch.ones(2, 2, dtype=torch.bool),
        token_weights=torch.full((2, 2), 0.25),
    )  # fmt: skip
    loss = float(GRPO(eps_low=0.2, eps_high=0.2).loss(x).loss.detach())
    up, down = math.exp(0.3), math.exp(-0.3)
    positive = -0.25 * (min(up * z, 1.2 * z) + min(down * z, max(down, 0.8) * z))
    negative = 0.25 * (max(up * z, min(up, 1.2) * z) + max(down * z, 0.8 * z))  # -min(r * -z, clip(r) * -z)
    assert loss == pytest.approx(positive + 0.25 * negative)
