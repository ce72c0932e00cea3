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
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sqlalchemy import Row

from opengyre.eventlog import EventLog, PayloadFetch
from opengyre.events import TrainingStepCompleted, WeightsPublished
from opengyre.models import checkpoint_info, load_checkpoint, model_config, model_state, resolve_model

from ._admission import AdmissionPolicy
from ._cell_process import CellHub, ProcessSatellite
from ._cell_roles import RoleCells
from ._config import TrainerConfig
from ._fault import fault
from ._lockstep import data_parallel_for, optimizer_file, rank_and_size, tell
from ._metrics import StepMetrics
from ._minibatch import plan_minibatches
from ._packing import MicroBatch, pack_samples
from ._prepare import PreparedStep, prepare_step
from ._publish import (
    EngineReload,
    PublishedCheckpoint,
    checkpoint_path,
    engine_versions,
    reload_engines,
    weight_version,
    write_checkpoint,
)
from ._samples import LossAggregation, TrainingSample, loss_normaliser
from ._sampling import PathSampler
from ._schedule import lr_at
from ._step import Learner, MiniBatch, StepResult
from ._store import ReadyGroup, TrainerStore
from ._streaming import Cell, MicroStepBuffer, Satellite, StreamingStep
from .algorithms import Algorithm, get_algorithm
from .backends import Backend, build_backend

__all__ = ["EngineState", "OnlineTrainer", "StepReport", "build_learner", "make_backend"]

log = logging.getLogger(__name__)


@dataclass
class EngineState:
    """What the trainer knows of one engine: the version it serves, and a load it failed.

    An engine that failed to load a version is in a state the trainer cannot vouch for (an engine without the
    CPU engine's verify-before-load may be half loaded): the calls it took part in after the failure are not
    trained, until it loads a version again. Calls are matched to engines through the scheduler's cells (the
    proxy names a cell's engine by the cell id)."""

    url: str
    serving: str | None = None  # the version it said it serves (its reload answer, or /model_info)
    failed_version: str | None = None
    failed_after_seq: int | None = None  # the log's end when the failure was seen
    message: str = ""


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
    source = start or config.init_checkpoint or resolve_model(config.model).checkpoint  # a pretrained model's
    if source is not None:
        model, _ = load_checkpoint(source)
        return build_backend(
            config.backend, model.config, model_state(model), seed=config.seed, tp=config.tp, pp=config.pp
        )
    return build_backend(config.backend, model_config(config.model), seed=config.seed, tp=config.tp, pp=config.pp)


def build_learner(
    config: TrainerConfig, backend: Backend, reference: Backend | None, algorithm: Algorithm | None = None
) -> Learner:
    return Learner(
        backend,
        algorithm or get_algorithm(config.algorithm, **config.algorithm_params),
        lr=config.lr,
        weight_decay=config.weight_decay,
        max_grad_norm=config.max_grad_norm,
        reference=reference,
        data_parallel=data_parallel_for(backend, config),
    )


def rng_state() -> dict[str, Any]:
    """The process's random generators (torch's, Python's): anything drawing from them continues after a resume
    exactly as it would have (the trainer's own draws are seeded by run, step and execution)."""
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def restore_rng(state: dict[str, Any] | None) -> None:
    if not state:
        return
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])


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
        algorithm = get_algorithm(config.algorithm, **config.algorithm_params)
        if algorithm.needs_reference and self.world > 1:
            raise ValueError(f"{algorithm.name}: a reference policy is single-process for now (no model-parallel one)")
        # The reference policy an algorithm asks for (a KL term's): the run's starting weights, frozen.
        reference = make_backend(config) if algorithm.needs_reference else None
        if reference is not None:
            for p in reference.parameters():
                p.requires_grad_(False)
        self.learner = build_learner(config, self.backend, reference, algorithm)
        if backend is None and resume_dir is not None and (resume_dir / optimizer_file(0)).exists():
            state = torch.load(resume_dir / optimizer_file(0), weights_only=True)
            if state.get("backend") == self.backend.name:
                self.learner.optimizer.load_state_dict(state["optimizer"])
            restore_rng(state.get("rng"))
        self.policy = AdmissionPolicy(
            group_size=config.group_size,
            breaker_ratio=config.breaker_ratio,
            normalize_std=config.normalize_std,
            positive_only=config.positive_only,
            max_negative_tokens=config.max_negative_tokens,
            mask_truncated_negatives=config.mask_truncated_negatives,
            negative_weight=config.negative_weight,
            overlong_max_tokens=config.overlong_max_tokens,
            overlong_buffer_tokens=config.overlong_buffer_tokens,
        )
        self.sampler = PathSampler(config.max_paths)
        self.satellites: list[Cell] = []
        self._hub = CellHub() if config.satellite_processes or config.follow_cell_roles else None
        self.cells: RoleCells | None = None  # satellites that follow the cells' roles in the log
        if config.follow_cell_roles:
            hub, frozen = self._hub, reference.hf_state_dict() if reference is not None else None
            assert hub is not None

            def start(cell: str) -> ProcessSatellite:
                return hub.start(
                    cell, config.backend, self.backend.config, config.algorithm, config.algorithm_params,
                    reference=frozen,
                )  # fmt: skip

            self.cells = RoleCells(store.cell_roles, start)
        for i in range(config.satellites):
            name = f"satellite-{i}"
            if self._hub is None:
                self.satellites.append(Satellite(name, make_backend(config), self.learner.algorithm, reference))
                continue
            self.satellites.append(
                self._hub.start(
                    name,
                    config.backend,
                    self.backend.config,
                    config.algorithm,
                    config.algorithm_params,
                    reference=reference.hf_state_dict() if reference is not None else None,
                )
            )
        self.stop = asyncio.Event()  # set by ``run``'s caller: a streaming step then ends with what it has
        self.streaming_buffer: MicroStepBuffer | None = None  # the running streaming step's (its progress)
        self.step_no = store.last_step(config.run_id)
        self._pending: set[str] = set()  # consumed by our steps, not yet folded by the projection
        self.engines: dict[str, EngineState] = {}
        self.metrics = StepMetrics()

    def ready(self) -> list[ReadyGroup]:
        groups = self.store.ready_groups(self.config.group_size)
        fresh = [g for g in groups if not any(o.execution_id in self._pending for o in g.outcomes)]
        if len(fresh) < len(groups):
            return fresh
        self._pending.clear()  # the projection has caught up with everything we consumed
        return fresh

    @property
    def aggregation(self) -> LossAggregation:
        return self.config.aggregation  # type: ignore[return-value]  # validated by TrainerConfig

    def untrusted(self, execution_ids: list[str]) -> dict[str, str]:
        """Executions with a call from an engine after it failed to load a version: execution -> reason."""
        by_url = self.store.engine_ids()
        since = {
            cell: st.failed_after_seq
            for url, st in self.engines.items()
            if st.failed_after_seq is not None
            for cell in by_url.get(url, [])
        }
        failed = self.store.served_after(execution_ids, since)
        return {e: f"engine-load-failed:{engine}" for e, engine in failed.items()}

    async def prepare_async(self, groups: list[ReadyGroup], prior: tuple[int, int] = (0, 0)) -> PreparedStep:
        """Read the groups' token payloads from the payload store, then ``prepare`` (in a worker thread)."""
        ids = [o.execution_id for g in groups for o in g.outcomes]
        payloads = await self.store.fetch_payloads(self.log, ids, self.stop)
        return await asyncio.to_thread(self.prepare, groups, prior, payloads)

    def prepare(
        self, groups: list[ReadyGroup], prior: tuple[int, int] = (0, 0), payloads: PayloadFetch | None = None
    ) -> PreparedStep:
        ids = [o.execution_id for g in groups for o in g.outcomes]
        return prepare_step(
            self.step_no + 1,
            groups,
            policy=self.policy,
            sampler=self.sampler,
            load_tree=lambda eid: self.store.tree(eid, payloads),
            corrupt=self.store.corrupt(ids),
            untrusted=self.untrusted(ids),
            version_steps=self.store.version_steps(self.config.run_id),
            seed=self.config.seed,
            max_staleness=self.config.max_staleness,
            vocab_size=int(self.backend.config.vocab_size),
            aggregation=self.aggregation,
            overlong_filter=self.config.overlong_filter,
            prior=prior,
        )

    def lr(self, step: int) -> float:
        c = self.config
        return lr_at(
            step, c.lr, warmup=c.lr_warmup_steps, schedule=c.lr_schedule, decay_steps=c.lr_decay_steps,
            min_ratio=c.lr_min_ratio,
        )  # fmt: skip

    def pick(self, groups: list[ReadyGroup]) -> list[ReadyGroup] | None:
        """The step's groups from the ready ones (oldest first), or None to wait for more.

        With dynamic sampling (DAPO) the step waits until ``groups_per_step`` of them have a learning signal;
        the groups without one that came before are consumed with it (recorded as no-signal). It looks at most
        at ``dynamic_sampling_max_groups`` groups, then trains on what it has."""
        want = self.config.groups_per_step
        if not self.config.uses_dynamic_sampling:
            return groups[:want] if len(groups) >= want else None
        cap = self.config.dynamic_sampling_max_groups or 10 * want
        chosen: list[ReadyGroup] = []
        signal = 0
        for g in groups[:cap]:
            chosen.append(g)
            adm = self.policy.admit(g.group_id, g.outcomes, g.size or None)
            signal += bool(adm.trained())
            if signal == want:
                return chosen
        return chosen if len(chosen) >= cap else None

    def plan(self, samples: list[TrainingSample], step: int) -> list[MiniBatch]:
        c = self.config
        return plan_minibatches(
            samples, mini_batches=c.mini_batches, aggregation=self.aggregation, norm_tokens=c.loss_norm_tokens,
            micro_batch_tokens=c.micro_batch_tokens, packed=c.packed, seed=c.seed, step=step,
        )  # fmt: skip

    async def _batch_step(self) -> tuple[PreparedStep, StepResult | None] | None:
        chosen = self.pick(await asyncio.to_thread(self.ready))
        if chosen is None:
            return None
        prepared = await self.prepare_async(chosen)
        if not prepared.samples:
            return prepared, None
        minibatches = self.plan(prepared.samples, prepared.step)
        lr = self.lr(prepared.step)
        if self.world > 1:
            # every rank runs the same updates over the same micro-batches through its shard of the model
            tell("step", (minibatches, self.config.ppo_epochs, lr))
        self.learner.set_lr(lr)
        return prepared, await asyncio.to_thread(self.learner.step, minibatches, self.config.ppo_epochs)

    async def _streaming_step(self, poll_s: float) -> tuple[PreparedStep, StepResult | None] | None:
        """Start on the first ready group; micro-batches stream to the core (and satellites) while the
        remaining groups of the step finish. Weights stay fixed until every micro-batch is in; the loss
        normaliser of the whole step divides the gradients before the update (the batch step's rule)."""
        first = await asyncio.to_thread(self.ready)
        if not first:
            return None
        cells = self.cells
        if cells is not None:
            await cells.sync(None)
            if cells.core is None:
                return None  # no cell is training-core: this process has no GPUs to train on now
        buffer = self.streaming_buffer = MicroStepBuffer()
        self.learner.set_lr(self.lr(self.step_no + 1))
        step = await asyncio.to_thread(StreamingStep, self.learner, buffer, epochs=self.config.ppo_epochs)
        for sat in self.satellites:
            step.join(sat)
        worker = asyncio.create_task(asyncio.to_thread(step.finish))
        prepared: PreparedStep | None = None
        used: set[str] = set()
        normaliser = 1.0
        try:
            while len(used) < self.config.groups_per_step:
                if cells is not None:
                    await cells.sync(step)  # between micro-steps: satellites join and leave as the roles say
                fresh = [g for g in await asyncio.to_thread(self.ready) if g.group_id not in used]
                if not fresh:
                    if self.stop.is_set():
                        break  # shutting down: train on what arrived
                    await asyncio.sleep(poll_s)
                    continue
                group = fresh[0]
                used.add(group.group_id)
                prior = (prepared.step_samples, prepared.step_dropped) if prepared is not None else (0, 0)
                part = await self.prepare_async([group], prior)
                for mb in self._pack(part.samples):
                    buffer.put(mb)
                if prepared is None:
                    prepared = part
                else:
                    prepared.merge(part)
            if prepared is not None and prepared.samples:
                normaliser = loss_normaliser(prepared.samples, self.aggregation, self.config.loss_norm_tokens)
        finally:
            buffer.close(normaliser)
            result = await self._finish_step(step, worker, poll_s)
        assert prepared is not None
        return prepared, (result if result.micro_steps else None)

    async def _finish_step(self, step: StreamingStep, worker: asyncio.Task[StepResult], poll_s: float) -> StepResult:
        """Wait for the step's update; meanwhile (the buffer's backlog) satellites still leave as the roles say."""
        cells = self.cells
        failed: Exception | None = None
        try:
            while cells is not None and failed is None and not worker.done():
                try:
                    await cells.sync(step)
                except Exception as exc:  # raised once the step has ended: its threads must not be left behind
                    failed = exc
                await asyncio.wait({worker}, timeout=poll_s)
            result = await worker
        finally:
            if cells is not None:
                await cells.after_step()
        if failed is not None:
            raise failed
        return result

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
        skipped = result is not None and result.updates == 0  # every update had a non-finite gradient norm
        if result is not None:
            fault("trainer.step.after-optimizer")
        if result is not None and not skipped:
            ckpt = await asyncio.to_thread(self._checkpoint, step)
            fault("trainer.publish.after-write")
        metrics = dict(result.metrics) if result else {}
        if result is not None:
            metrics.update(
                grad_norm=result.grad_norm, targets=float(result.n_targets), micro_steps=result.micro_steps,
                updates=float(result.updates), lr=self.learner.optimizer.param_groups[0]["lr"],
            )  # fmt: skip
            if result.skipped_updates:
                log.warning(
                    "step %d: %d update(s) with a non-finite gradient norm skipped", step, result.skipped_updates
                )
                metrics["update_skipped"] = float(result.skipped_updates)
        if prepared.reward_mean is not None:
            metrics["reward_mean"] = prepared.reward_mean
        # The step's circuit breaker: whether it tripped, what it kept, the share of the step dropped.
        metrics.update(self.engine_metrics())  # as the step started: after the previous step's reloads
        metrics["breaker_trips"] = float(prepared.breaker_tripped)
        metrics["breaker_kept"] = float(prepared.breaker_kept)
        metrics["dropped_fraction"] = prepared.step_dropped / prepared.step_samples if prepared.step_samples else 0.0
        metrics.update(
            paths=float(prepared.paths),
            leaves=float(prepared.leaves),
            forward_tokens=float(prepared.forward_tokens),
            all_paths_forward_tokens=float(prepared.all_paths_forward_tokens),
            generated_tokens=float(prepared.generated_tokens),
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
                fault("trainer.publish.after-completed")
                await self.log.append(published)
                fault("trainer.publish.after-published")
        self.metrics.observe(completed)
        self._pending |= set(prepared.trained) | set(prepared.dropped)
        self.step_no = step
        urls = await asyncio.to_thread(self.engine_urls)
        reloads: list[EngineReload] = []
        if ckpt and urls:
            reloads = await reload_engines(urls, ckpt, attempts=self.config.engine_reload_attempts)
            await self._track(reloads, ckpt.weight_version)
        return StepReport(prepared, result, ckpt, completed, published, reloads)

    async def _track(self, reloads: list[EngineReload], version: str) -> None:
        """Which engine serves which version; a failed load marks the engine's later calls untrusted."""
        failed = [r for r in reloads if not r.success]
        served = await engine_versions([r.url for r in failed]) if failed else {}
        end = await self.log.last_seq() if failed and self.log is not None else 0
        for r in reloads:
            st = self.engines.setdefault(r.url, EngineState(r.url))
            if r.success:
                st.serving, st.failed_version, st.failed_after_seq, st.message = version, None, None, ""
                continue
            log.warning("engine %s did not load %s (%d attempts): %s", r.url, version, r.attempts, r.message)
            st.serving, st.failed_version, st.message = served.get(r.url), version, r.message
            if st.failed_after_seq is None:
                st.failed_after_seq = end

    def engine_metrics(self) -> dict[str, float]:
        latest = weight_version(self.config.run_id, self.step_no) if self.step_no else None
        states = list(self.engines.values())
        return {
            "engines": float(len(states)),
            "engines_current": float(sum(1 for s in states if latest is not None and s.serving == latest)),
            "engines_failed": float(sum(1 for s in states if s.failed_version is not None)),
        }

    def _pack(self, samples: list[TrainingSample]) -> list[MicroBatch]:
        return pack_samples(samples, self.config.micro_batch_tokens, packed=self.config.packed) if samples else []

    def _checkpoint(self, step: int) -> PublishedCheckpoint:
        path = checkpoint_path(self.config.checkpoint_dir, self.config.run_id, step)
        if self.world > 1:
            path.mkdir(parents=True, exist_ok=True)
            tell("checkpoint", str(path))  # the weight export below gathers from every rank
        ckpt = write_checkpoint(self.backend, self.config.checkpoint_dir, self.config.run_id, step)
        # Optimizer moments and RNG state beside the weights: a restart resumes the run exactly (same backend only).
        state = {"backend": self.backend.name, "optimizer": self.learner.optimizer.state_dict(), "rng": rng_state()}
        torch.save(state, ckpt.path / optimizer_file(0))
        return ckpt

    def serve_metrics(self, port: int | None = None) -> int:
        """Serve Prometheus ``/metrics`` on ``port`` (default: the config's ``metrics_port``); returns the port."""
        chosen = self.config.metrics_port if port is None else port
        if chosen is None:
            raise ValueError("no metrics_port configured")
        return self.metrics.serve(chosen)

    def close(self) -> None:
        """Release the followers of a model-parallel run (they return from ``follow``) and the metrics server."""
        self.metrics.close()
        for sat in self.satellites:
            sat.close()
        if self.cells is not None:
            self.cells.close()
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
        for u, v in served.items():
            self.engines.setdefault(u, EngineState(u)).serving = v
        stale = [u for u, v in served.items() if v is not None and v != latest.weight_version]
        ckpt = PublishedCheckpoint(latest.weight_version, latest.step, Path(latest.uri), latest.digest)
        if not stale:
            return []
        reloads = await reload_engines(stale, ckpt, attempts=self.config.engine_reload_attempts)
        await self._track(reloads, ckpt.weight_version)
        return reloads

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
