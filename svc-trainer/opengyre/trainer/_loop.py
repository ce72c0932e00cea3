"""The online trainer: ready groups in, one optimizer step, a checkpoint and two events out.

Each step: take ``groups_per_step`` complete groups from the projection, prepare bounded samples, pack them
into micro-batches, train (streaming the micro-steps to the learner), write a checkpoint, append
``TrainingStepCompleted`` (what was trained, what was dropped and why) and ``WeightsPublished``, and ask the
engines to hot-reload. The projection then marks the consumed executions, so nothing is trained twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Row

from opengyre.eventlog import EventLog, PayloadFetch
from opengyre.events import TrainingStepCompleted, WeightsPublished
from opengyre.models import checkpoint_info, load_checkpoint, model_config

from ._admission import AdmissionPolicy
from ._config import TrainerConfig
from ._lockstep import data_parallel_for, optimizer_file, rank_and_size, tell
from ._packing import MicroBatch, pack_samples
from ._prepare import PreparedStep, prepare_step
from ._publish import (
    EngineReload,
    PublishedCheckpoint,
    checkpoint_path,
    engine_versions,
    reload_engines,
    write_checkpoint,
)
from ._samples import TrainingSample
from ._sampling import PathSampler
from ._step import Learner, StepResult
from ._store import ReadyGroup, TrainerStore
from ._streaming import MicroStepBuffer, Satellite, streaming_step
from .algorithms import get_algorithm
from .backends import Backend, build_backend

__all__ = ["OnlineTrainer", "StepReport", "build_learner", "make_backend"]

log = logging.getLogger(__name__)


@dataclass
class StepReport:
    prepared: PreparedStep
    result: StepResult | None
    checkpoint: PublishedCheckpoint | None
    completed: TrainingStepCompleted
    published: WeightsPublished | None
    reloads: list[EngineReload]


def make_backend(config: TrainerConfig, start: Path | None = None) -> Backend:
    """A backend holding ``start`` (a checkpoint folder), else ``init_checkpoint``, else the seeded init."""
    source = start or config.init_checkpoint
    if source is not None:
        model, _ = load_checkpoint(source)
        return build_backend(
            config.backend, model.config, model.state_dict(), seed=config.seed, tp=config.tp, pp=config.pp
        )
    return build_backend(config.backend, model_config(config.model), seed=config.seed, tp=config.tp, pp=config.pp)


def build_learner(config: TrainerConfig, backend: Backend, reference: Backend | None) -> Learner:
    return Learner(
        backend,
        get_algorithm(config.algorithm, **config.algorithm_params),
        lr=config.lr,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        reference=reference,
        data_parallel=data_parallel_for(backend, config),
    )


def step_event_id(run_id: str, step: int, what: str) -> str:
    """Event ids derived from the step, so a retried or recovered append is stored once (JetStream dedup)."""
    return f"trainer-{run_id}-s{step}-{what}"


def unpublished_step(store: TrainerStore, config: TrainerConfig, latest: Row[Any] | None) -> WeightsPublished | None:
    """The WeightsPublished a crash left unsent: the last step completed with a version that was never published
    (``latest`` is the run's latest published weights), and its checkpoint is whole on disk (it is written
    before the step's events)."""
    last = store.last_step_row(config.run_id)
    if last is None or not last.weight_version:
        return None
    if latest is not None and latest.weight_version == last.weight_version:
        return None
    path = checkpoint_path(config.checkpoint_dir, config.run_id, int(last.step)).resolve()
    info = checkpoint_info(path)
    if info is None or info["weight_version"] != last.weight_version:
        return None
    return WeightsPublished(
        event_id=step_event_id(config.run_id, int(last.step), "weights"),
        run_id=config.run_id,
        weight_version=str(last.weight_version),
        step=int(last.step),
        uri=str(path),
        digest=info["sha256"],
    )


class OnlineTrainer:
    def __init__(
        self, config: TrainerConfig, store: TrainerStore, log_: EventLog | None, backend: Backend | None = None
    ) -> None:
        config.validate()
        self.config = config
        self.store = store
        self.log = log_
        # A restarted run resumes from its latest published weights (and optimizer state), never from scratch.
        latest = store.latest_weights(config.run_id)
        self.resumed_from: str | None = latest.weight_version if latest is not None else None
        resume_dir = Path(latest.uri) if latest is not None else None
        # A crash between a step's TrainingStepCompleted (its executions are consumed) and its WeightsPublished
        # leaves trained weights on disk that nobody announced: resume from them and announce them (``recover``).
        self._unpublished = unpublished_step(store, config, latest)
        if self._unpublished is not None:
            self.resumed_from = self._unpublished.weight_version
            resume_dir = Path(self._unpublished.uri)
        self.rank, self.world = rank_and_size()
        if self.world > 1:
            if self.rank != 0:
                raise RuntimeError("only rank 0 runs the online trainer; the other ranks run lockstep.follow")
            if self.world % (config.tp * config.pp):
                raise ValueError(f"{self.world} ranks do not split into replicas of tp={config.tp} x pp={config.pp}")
            if config.streaming or config.satellites:
                raise ValueError("multi-process runs step in lockstep: streaming and satellites are single-process")
            tell("start", str(resume_dir) if resume_dir else None)  # the followers build their backends now
        self.backend = backend or make_backend(config, resume_dir)
        kl = float(config.algorithm_params.get("kl_beta", 0.0) or 0.0) > 0
        if kl and self.world > 1:
            raise ValueError("the KL term is single-process for now (no model-parallel reference)")
        # The KL term needs a reference policy: the run's starting weights, frozen.
        reference = make_backend(config) if kl else None
        if reference is not None:
            for p in reference.parameters():
                p.requires_grad_(False)
        self.learner = build_learner(config, self.backend, reference)
        if backend is None and resume_dir is not None and (resume_dir / optimizer_file(0)).exists():
            state = torch.load(resume_dir / optimizer_file(0), weights_only=True)
            if state.get("backend") == self.backend.name:
                self.learner.optimizer.load_state_dict(state["optimizer"])
        self.policy = AdmissionPolicy(
            group_size=config.group_size,
            breaker_ratio=config.breaker_ratio,
            normalize_std=config.normalize_std,
            positive_only=config.positive_only,
        )
        self.sampler = PathSampler(config.max_paths)
        self.satellites = [
            Satellite(f"satellite-{i}", make_backend(config), self.learner.algorithm, reference)
            for i in range(config.satellites)
        ]
        self.stop = asyncio.Event()  # set by ``run``'s caller: a streaming step then ends with what it has
        self.step_no = store.last_step(config.run_id)
        self._pending: set[str] = set()  # consumed by our steps, not yet folded by the projection

    def ready(self) -> list[ReadyGroup]:
        groups = self.store.ready_groups(self.config.group_size)
        fresh = [g for g in groups if not any(o.execution_id in self._pending for o in g.outcomes)]
        if len(fresh) < len(groups):
            return fresh
        self._pending.clear()  # the projection has caught up with everything we consumed
        return fresh

    async def prepare_async(self, groups: list[ReadyGroup], step_share: float = 1.0) -> PreparedStep:
        """Read the groups' token payloads from the payload store, then ``prepare`` (in a worker thread)."""
        ids = [o.execution_id for g in groups for o in g.outcomes]
        payloads = await self.store.fetch_payloads(self.log, ids, self.stop)
        return await asyncio.to_thread(self.prepare, groups, step_share, payloads)

    def prepare(
        self, groups: list[ReadyGroup], step_share: float = 1.0, payloads: PayloadFetch | None = None
    ) -> PreparedStep:
        ids = [o.execution_id for g in groups for o in g.outcomes]
        return prepare_step(
            self.step_no + 1,
            groups,
            step_share=step_share,
            policy=self.policy,
            sampler=self.sampler,
            load_tree=lambda eid: self.store.tree(eid, payloads),
            corrupt=self.store.corrupt(ids),
            version_steps=self.store.version_steps(self.config.run_id),
            seed=self.config.seed,
            max_staleness=self.config.max_staleness,
            max_negative_tokens=self.config.max_negative_tokens,
            vocab_size=int(self.backend.config.vocab_size),
        )

    async def _batch_step(self) -> tuple[PreparedStep, StepResult | None] | None:
        groups = await asyncio.to_thread(self.ready)
        if len(groups) < self.config.groups_per_step:
            return None
        prepared = await self.prepare_async(groups[: self.config.groups_per_step])
        if not prepared.samples:
            return prepared, None
        mbs = self._pack(prepared.samples)
        if self.world > 1:
            tell("step", mbs)  # every rank runs the same micro-batches through its shard of the model
        return prepared, await asyncio.to_thread(self.learner.step, mbs)

    async def _streaming_step(self, poll_s: float) -> tuple[PreparedStep, StepResult | None] | None:
        """Start on the first ready group; micro-batches stream to the core (and satellites) while the
        remaining groups of the step finish. Weights stay fixed until every micro-batch is in."""
        first = await asyncio.to_thread(self.ready)
        if not first:
            return None
        per_group = 1.0 / self.config.groups_per_step
        buffer = MicroStepBuffer()
        worker = asyncio.create_task(asyncio.to_thread(streaming_step, self.learner, buffer, self.satellites))
        prepared: PreparedStep | None = None
        used: set[str] = set()
        try:
            while len(used) < self.config.groups_per_step:
                fresh = [g for g in await asyncio.to_thread(self.ready) if g.group_id not in used]
                if not fresh:
                    if self.stop.is_set():
                        break  # shutting down: train on what arrived
                    await asyncio.sleep(poll_s)
                    continue
                group = fresh[0]
                used.add(group.group_id)
                part = await self.prepare_async([group], per_group)
                for mb in self._pack(part.samples):
                    buffer.put(mb)
                if prepared is None:
                    prepared = part
                else:
                    prepared.merge(part)
        finally:
            buffer.close()
            result = await worker
        assert prepared is not None
        return prepared, (result if result.micro_steps else None)

    async def recover(self) -> WeightsPublished | None:
        """Announce the weights of a step that completed before a crash but was never published."""
        event, self._unpublished = self._unpublished, None
        if event is not None and self.log is not None:
            await self.log.append(event)  # a deterministic event id: a repeat is stored once
        return event

    async def step_once(self, poll_s: float = 0.2) -> StepReport | None:
        if self._unpublished is not None:
            await self.recover()
        out = await (self._streaming_step(poll_s) if self.config.streaming else self._batch_step())
        if out is None:
            return None
        prepared, result = out
        step = prepared.step
        ckpt: PublishedCheckpoint | None = None
        skipped = result is not None and not math.isfinite(result.grad_norm)  # Learner.apply left the weights
        if result is not None and not skipped:
            ckpt = await asyncio.to_thread(self._checkpoint, step)
        metrics = dict(result.metrics) if result else {}
        if result is not None:
            metrics.update(grad_norm=result.grad_norm, targets=float(result.n_targets), micro_steps=result.micro_steps)
        if skipped:
            log.warning("step %d: non-finite gradient norm, update skipped", step)
            metrics["update_skipped"] = 1.0
        if prepared.reward_mean is not None:
            metrics["reward_mean"] = prepared.reward_mean
        metrics["breaker_trips"] = float(sum(g.breaker_tripped for g in prepared.groups))
        metrics.update(
            paths=float(prepared.paths),
            leaves=float(prepared.leaves),
            forward_tokens=float(prepared.forward_tokens),
            all_paths_forward_tokens=float(prepared.all_paths_forward_tokens),
        )
        metrics = {k: v for k, v in metrics.items() if math.isfinite(v)}  # JSON has no NaN: null would not decode
        completed = TrainingStepCompleted(
            event_id=step_event_id(self.config.run_id, step, "completed"),
            run_id=self.config.run_id,
            step=step,
            weight_version=ckpt.weight_version if ckpt else "",
            loss=result.loss if result and math.isfinite(result.loss) else 0.0,
            n_samples=len(prepared.samples),
            n_tokens=result.n_tokens if result else 0,
            execution_ids=prepared.trained,
            dropped=prepared.dropped,
            staleness_mean=prepared.staleness_mean,
            staleness_max=prepared.staleness_max,
            metrics=metrics,
        )
        published = None
        if ckpt is not None:
            published = WeightsPublished(
                event_id=step_event_id(self.config.run_id, step, "weights"),
                run_id=self.config.run_id, weight_version=ckpt.weight_version, step=step, uri=str(ckpt.path),
                digest=ckpt.digest,
            )  # fmt: skip
        if self.log is not None:
            await self.log.append(completed)
            if published is not None:
                await self.log.append(published)
        self._pending |= set(prepared.trained) | set(prepared.dropped)
        self.step_no = step
        urls = await asyncio.to_thread(self.engine_urls)
        reloads = await reload_engines(urls, ckpt) if ckpt and urls else []
        for r in reloads:
            if not r.success:
                log.warning("engine %s did not reload %s: %s", r.url, ckpt.weight_version if ckpt else "", r.message)
        return StepReport(prepared, result, ckpt, completed, published, reloads)

    def _pack(self, samples: list[TrainingSample]) -> list[MicroBatch]:
        return pack_samples(samples, self.config.micro_batch_tokens, packed=self.config.packed) if samples else []

    def _checkpoint(self, step: int) -> PublishedCheckpoint:
        path = checkpoint_path(self.config.checkpoint_dir, self.config.run_id, step)
        if self.world > 1:
            path.mkdir(parents=True, exist_ok=True)
            tell("checkpoint", str(path))  # the weight export below gathers from every rank
        ckpt = write_checkpoint(self.backend, self.config.checkpoint_dir, self.config.run_id, step)
        # Optimizer moments beside the weights: a restart resumes the run exactly (same backend only).
        state = {"backend": self.backend.name, "optimizer": self.learner.optimizer.state_dict()}
        torch.save(state, ckpt.path / optimizer_file(0))
        return ckpt

    def close(self) -> None:
        """Release the followers of a model-parallel run (they return from ``follow``)."""
        if self.world > 1:
            tell("stop")
            self.world = 1

    def engine_urls(self) -> list[str]:
        found = self.store.rollout_engines() if self.config.discover_engines else []
        return sorted(set(self.config.engines) | set(found))

    async def sync_engines(self) -> list[EngineReload]:
        """Reload every engine that serves another version than the run's latest (a cell that just turned to
        rollout, an engine that missed a reload); the others are left alone."""
        latest = await asyncio.to_thread(self.store.latest_weights, self.config.run_id)
        urls = await asyncio.to_thread(self.engine_urls)
        if latest is None or not urls:
            return []
        served = await engine_versions(urls)
        stale = [u for u, v in served.items() if v is not None and v != latest.weight_version]
        ckpt = PublishedCheckpoint(latest.weight_version, latest.step, Path(latest.uri), latest.digest)
        return await reload_engines(stale, ckpt) if stale else []

    async def run(self, stop: asyncio.Event, *, max_steps: int | None = None, poll_s: float = 0.5) -> int:
        self.stop = stop
        done = 0
        loop = asyncio.get_running_loop()
        next_sync = loop.time()
        while not stop.is_set() and (max_steps is None or done < max_steps):
            report = await self.step_once()
            if report is None:
                if loop.time() >= next_sync:
                    next_sync = loop.time() + self.config.engine_sync_s
                    for r in await self.sync_engines():
                        log.info("engine %s brought to the latest weights: %s", r.url, r.success)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), poll_s)
                continue
            done += 1
            log.info(
                "step %d: loss %.4f, %d samples",
                report.completed.step,
                report.completed.loss,
                report.completed.n_samples,
            )
        return done
