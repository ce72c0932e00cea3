"""The rollout driver: the closed loop on the embedded stack, as a client of the services.

svc-synth ingests skills and builds validated tasks; CPU engines start, one per cell, and are registered with the
scheduler (the proxy routes to them from the cell events); for each step the scheduler places the step's groups
on rollout cells and appends ``execution-dispatched``; each execution runs the harness in its sandbox through the
proxy and ends with the trainer grading its workspace (``execution-finished``); the trainer service trains as
soon as a step's groups are complete (its ``trainer.toml``, written here), publishes weights and reloads the
engines; the scheduler's policy moves cells between rollout and training; svc-synth hardens task versions that
got easy, and later groups use the newest version. Nothing here appends an event: each has its owning service.

Resumable: group ids are derived from the run and the step, and a group the scheduler already dispatched is
answered with its members again, so a driver started again on the same data dir re-runs only what has no
outcome yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc
import httpx
import tomli_w

from opengyre.config import Settings
from opengyre.harness import HarnessSpec, builtin_spec
from opengyre.runtime import Stack
from opengyre.v1 import (
    common_pb2,
    proxy_pb2_grpc,
    scheduler_pb2,
    scheduler_pb2_grpc,
    synth_pb2,
    synth_pb2_grpc,
    trainer_pb2,
    trainer_pb2_grpc,
)

from ._config import RunConfig
from ._rollout import Assignment, Finished, roll_out

__all__ = [
    "AfterStart",
    "BeforeStop",
    "LoopResult",
    "TaskRef",
    "WarmStart",
    "proxy_env",
    "run_loop",
    "scheduler_env",
    "trainer_settings",
]

log = logging.getLogger(__name__)

Say = Callable[[str], None]
T = TypeVar("T")
_NOT_NOW = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)
POLL_S = 0.5


@dataclass(frozen=True)
class TaskRef:
    task_id: str
    version: int
    task_dir: Path
    instruction: str


@dataclass
class LoopResult:
    tasks: list[TaskRef] = field(default_factory=list)
    finished: list[Finished] = field(default_factory=list)
    steps: list[trainer_pb2.TrainingStep] = field(default_factory=list)
    hardened: int = 0
    timings: dict[str, float] = field(default_factory=dict)  # phase -> seconds (wall clock)


def proxy_env(model: str) -> dict[str, str]:
    """The proxy serves the run's model by its engines' name, recording token ids in its tokenizer."""
    from opengyre.models import resolve_model

    env = {"OPENGYRE_PROXY_MODELS": _served_name(model)}
    source = resolve_model(model)
    if source.checkpoint is not None:  # a pretrained model (a preset uses the shipped byte-level tokenizer)
        env["OPENGYRE_PROXY_TOKENIZER"] = str(source.tokenizer_dir)
    return env


def scheduler_env(cfg: RunConfig) -> dict[str, str]:
    """The scheduler's RL loop and policy for this run (its service reads them at start)."""
    return {
        "OPENGYRE_SCHEDULER_POLICY": cfg.policy,
        "OPENGYRE_SCHEDULER_AUTO": "1",
        "OPENGYRE_SCHEDULER_MAX_LAG": str(cfg.max_lag),
        "OPENGYRE_SCHEDULER_GROUPS_PER_STEP": str(cfg.groups_per_step),
        "OPENGYRE_SCHEDULER_GROUP_SIZE": str(cfg.group_size),
        "OPENGYRE_SCHEDULER_STEPS": str(cfg.steps),
    }


def trainer_settings(cfg: RunConfig, settings: Settings, engines: list[str], init: Path | None) -> dict[str, object]:
    """The trainer service's ``trainer.toml`` for this run: it trains as soon as a step's groups are complete
    and reloads every engine after each step (whatever role its cell has now: it serves again after the switch)."""
    out: dict[str, object] = {
        "run_id": cfg.run_id,
        "model": cfg.model,
        "algorithm": cfg.algorithm,
        "group_size": cfg.group_size,
        "groups_per_step": cfg.groups_per_step,
        "lr": cfg.lr,
        "max_paths": cfg.max_paths,
        "micro_batch_tokens": cfg.micro_batch_tokens,
        "max_staleness": max(1, cfg.max_lag),
        "seed": cfg.seed,
        "checkpoint_dir": str((settings.data_dir / "checkpoints").resolve()),
        "engines": engines,
        "engine_sync_s": 1.0,
    }
    if init is not None:
        out["init_checkpoint"] = str(init)
    return out


class _Loop:
    def __init__(self, cfg: RunConfig, settings: Settings, say: Say, spec: HarnessSpec) -> None:
        self.cfg, self.settings, self.say, self.spec = cfg, settings, say, spec
        self.result = LoopResult()
        self.channels: list[grpc.aio.Channel] = []
        self.engine_urls: list[str] = []
        self.start_version = "default"  # what the engines serve before any step is published (a warm start's)

    def channel(self, stack: Stack, name: str) -> grpc.aio.Channel:
        ch = grpc.aio.insecure_channel(f"{self.settings.host}:{stack.children[name].port}")
        self.channels.append(ch)
        return ch

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()

    # --- set-up ------------------------------------------------------------------------------------------

    async def register_cells(self, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub) -> None:
        for i, url in enumerate(self.engine_urls):
            req = scheduler_pb2.RegisterCellRequest(
                cell_id=f"{self.cfg.run_id}-cell{i}", capacity=self.cfg.cell_capacity, engine_url=url, role="rollout"
            )
            try:
                await sched.RegisterCell(req, timeout=60)
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:  # a resumed run: registered before
                    raise
        self.say(f"cells: {len(self.engine_urls)} CPU cells of {self.cfg.cell_capacity} registered ({self.cfg.policy})")

    async def build_tasks(self, synth: synth_pb2_grpc.SynthServiceAsyncStub) -> list[TaskRef]:
        cfg = self.cfg
        got = await synth.IngestSkills(synth_pb2.IngestSkillsRequest(source=cfg.skills), timeout=300)
        names = set(cfg.skill_names)
        ids = [s.skill_id for s in got.skills if s.accepted and (not names or s.name in names)]
        missing = names - {s.name for s in got.skills if s.accepted}
        if missing or not ids:
            raise RuntimeError(f"no accepted skill(s) {sorted(missing) or '(none at all)'} in {cfg.skills}")
        req = synth_pb2.BuildTasksRequest(
            skill_ids=ids, tasks_per_skill=cfg.tasks_per_skill, seed=cfg.seed, challenges=cfg.challenges,
            level=cfg.level,
        )  # fmt: skip
        built = await _until_accepted(lambda: synth.BuildTasks(req, timeout=600), (grpc.StatusCode.NOT_FOUND,))
        ok = [t for t in built.tasks if t.ok]
        self.say(f"synth: {len(ids)} skill(s) -> {len(built.tasks)} task(s), {len(ok)} validated")
        if not ok:
            raise RuntimeError("no task passed validation: nothing to train on")
        return [_task_ref(t.task_id, t.version, Path(t.task_dir)) for t in ok]

    async def current(self, synth: synth_pb2_grpc.SynthServiceAsyncStub, task: TaskRef) -> TaskRef:
        """The task's newest validated version (hardening adds versions while the run goes on)."""
        req = synth_pb2.GetLineageRequest(task_id=task.task_id)
        lineage = await _up(lambda: synth.GetLineage(req, timeout=60))
        valid = [v for v in lineage.versions if v.validated == "true" and v.task_dir]
        if not valid:
            return task
        v = max(valid, key=lambda v: v.version)
        return task if v.version == task.version else _task_ref(task.task_id, v.version, Path(v.task_dir))

    # --- the loop ----------------------------------------------------------------------------------------

    async def engines_serve(self, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, bound_s: float = 120.0) -> None:
        """On-policy (max_lag 0): the next rollouts wait until every engine serves the latest published weights."""
        req = trainer_pb2.ListWeightsRequest(run_id=self.cfg.run_id)
        weights = await _up(lambda: trainer.ListWeights(req, timeout=30))
        if not weights.versions:
            return
        want = weights.versions[-1].weight_version
        deadline = time.monotonic() + bound_s
        async with httpx.AsyncClient(timeout=10) as http:
            for url in self.engine_urls:
                while True:
                    with contextlib.suppress(httpx.HTTPError, ValueError):
                        if (await http.get(f"{url}/model_info")).json().get("weight_version") == want:
                            break
                    if time.monotonic() > deadline:
                        log.warning("engine %s does not serve %s after %.0f s; rolling out anyway", url, want, bound_s)
                        break
                    await asyncio.sleep(POLL_S)

    async def dispatch(
        self, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub, step: int, tasks: list[TaskRef]
    ) -> scheduler_pb2.DispatchGroupsReply:
        groups = [
            scheduler_pb2.GroupRequest(
                group_id=f"{self.cfg.run_id}-s{step}-g{k}",
                task_id=t.task_id,
                task_version=t.version,
                group_size=self.cfg.group_size,
            )
            for k, t in enumerate(tasks)
        ]
        req = scheduler_pb2.DispatchGroupsRequest(groups=groups, timeout_s=self.cfg.timeout_s)
        return await _until_accepted(lambda: sched.DispatchGroups(req, timeout=60), _NOT_NOW)

    async def watch(
        self, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
        stop: asyncio.Event,
    ) -> None:  # fmt: skip
        """One plain line per completed training step (the hook a live dashboard replaces)."""
        seen = 0
        while not stop.is_set():
            with contextlib.suppress(grpc.aio.AioRpcError):
                req = trainer_pb2.ListStepsRequest(run_id=self.cfg.run_id)
                steps = (await trainer.ListSteps(req, timeout=30)).steps
                for s in steps[seen:]:
                    st = await sched.GetState(scheduler_pb2.GetStateRequest(), timeout=30)
                    roles = ", ".join(f"{c.cell_id.rsplit('-', 1)[-1]}={c.role}" for c in st.cells)
                    reward = f"{s.reward_mean:.3f}" if s.has_reward_mean else "-"
                    self.say(
                        f"step {s.step}: trained {s.n_trained}, dropped {s.n_dropped}, reward {reward}, "
                        f"loss {s.loss:.4f}, weights {s.weight_version or '(none)'}; cells {roles}"
                    )
                seen = len(steps)
                self.result.steps = list(steps)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), POLL_S)

    async def run(self, stack: Stack) -> LoopResult:
        cfg, res = self.cfg, self.result
        synth = synth_pb2_grpc.SynthServiceStub(self.channel(stack, "synth"))
        sched = scheduler_pb2_grpc.SchedulerServiceStub(self.channel(stack, "scheduler"))
        trainer = trainer_pb2_grpc.TrainerServiceStub(self.channel(stack, "trainer"))
        proxy = proxy_pb2_grpc.ProxyServiceStub(self.channel(stack, "proxy"))
        await self.register_cells(sched)
        tasks = res.tasks
        model = _served_name(cfg.model)
        workdir = (self.settings.data_dir / "rollouts").resolve()
        stop = asyncio.Event()
        watcher = asyncio.create_task(self.watch(trainer, sched, stop))
        running: set[asyncio.Task[Finished]] = set()
        t0 = time.monotonic()
        try:
            for step in range(1, cfg.steps + 1):
                if cfg.max_lag == 0 and step > 1:
                    await self.engines_serve(trainer)
                first = (step - 1) * cfg.groups_per_step  # the tasks take turns, one group each
                turn = [tasks[(first + k) % len(tasks)] for k in range(cfg.groups_per_step)]
                chosen = [await self.current(synth, t) for t in turn]
                reply = await self.dispatch(sched, step, chosen)
                by_id = {t.task_id: t for t in chosen}
                self.say(
                    f"dispatch: step {reply.step}, {len(reply.executions)} executions of "
                    f"{', '.join(f'{t.task_id} v{t.version}' for t in chosen)} on weights "
                    f"{self.start_version if reply.weight_version == 'default' else reply.weight_version}"
                )
                for e in reply.executions:
                    t = by_id[e.task_id]
                    a = Assignment(
                        e.execution_id, e.group_id, e.task_id, t.version, e.cell_id, reply.step, t.task_dir,
                        t.instruction,
                    )  # fmt: skip
                    job = asyncio.create_task(
                        roll_out(a, proxy=proxy, trainer=trainer, spec=self.spec, model=model, workdir=workdir,
                                 timeout_s=cfg.timeout_s)
                    )  # fmt: skip
                    running.add(job)
                    job.add_done_callback(lambda j: self._done(j, running))
            if running:
                await asyncio.wait(set(running))
            res.timings["rollout"] = time.monotonic() - t0
            t0 = time.monotonic()
            await self.trained(trainer, sched)
            res.timings["training tail"] = time.monotonic() - t0
            res.hardened = await self.harden(synth)
        finally:
            stop.set()
            await watcher
            for j in running:
                j.cancel()
        return res

    async def synth_caught_up(self, synth: synth_pb2_grpc.SynthServiceAsyncStub, polls: int = 600) -> None:
        for _ in range(polls):
            status = await _up(lambda: synth.GetStatus(common_pb2.StatusRequest(), timeout=30))
            if all(p.pending == 0 for p in status.projections):
                return
            await asyncio.sleep(POLL_S / 5)

    async def harden(self, synth: synth_pb2_grpc.SynthServiceAsyncStub) -> int:
        """Once the synth's projections have folded every outcome, harden what got easy (its worker does so on
        its own while the run goes on; this is the last pass before the stack stops). Returns the versions
        hardened in the whole run."""
        await self.synth_caught_up(synth)
        done = await _up(lambda: synth.HardenTasks(synth_pb2.HardenTasksRequest(), timeout=600))
        for h in done.hardened:
            self.say(f"hardened {h.task_id} v{h.from_version} -> v{h.to_version}: {h.reason}")
        await self.synth_caught_up(synth)
        listed = await _up(lambda: synth.ListTasks(synth_pb2.ListTasksRequest(), timeout=60))
        return sum(t.hardened_count for t in listed.tasks)

    def _done(self, job: asyncio.Task[Finished], running: set[asyncio.Task[Finished]]) -> None:
        running.discard(job)
        if job.cancelled():
            return
        if (exc := job.exception()) is not None:
            self.say(f"rollout failed: {exc!r}")
            return
        f = job.result()
        self.result.finished.append(f)
        score = "-" if f.score is None else f"{f.score:.2f}"
        self.say(
            f"  {f.assignment.execution_id} on {f.assignment.cell_id}: {f.finish_reason} -> {f.status} "
            f"score {score} ({f.duration_s:.1f} s)"
        )

    async def trained(
        self, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub,
        bound_s: float = 900.0,
    ) -> None:  # fmt: skip
        """Every step trained, and the cells back from training (the policy returns them once nothing is left)."""
        deadline = time.monotonic() + bound_s
        req = trainer_pb2.ListStepsRequest(run_id=self.cfg.run_id)
        while time.monotonic() < deadline:
            steps = (await _up(lambda: trainer.ListSteps(req, timeout=30))).steps
            st = await _up(lambda: sched.GetState(scheduler_pb2.GetStateRequest(), timeout=30))
            if len(steps) >= self.cfg.steps and all(c.role == "rollout" for c in st.cells):
                self.result.steps = list(steps)
                return
            await asyncio.sleep(POLL_S)
        raise TimeoutError(f"the trainer did not complete {self.cfg.steps} step(s) within {bound_s:.0f} s")


def _served_name(model: str) -> str:
    from opengyre.proxy.engine import EngineConfig

    return EngineConfig(preset=model).model_name


def _task_ref(task_id: str, version: int, task_dir: Path) -> TaskRef:
    return TaskRef(task_id, version, task_dir, (task_dir / "instruction.md").read_text())


async def _until_accepted(call: Callable[[], Awaitable[T]], codes: tuple[grpc.StatusCode, ...], polls: int = 2400) -> T:
    """Call until the service accepts: a refusal with one of ``codes`` means "not now" (the policy holds the
    step, cells are full, a projection has not caught up, the service is being restarted by the supervisor), so
    it is asked again shortly; after ``polls`` tries the last refusal is raised."""
    for i in range(polls):
        try:
            return await call()
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in codes or i == polls - 1:
                raise
        await asyncio.sleep(POLL_S)
    raise AssertionError("unreachable")


async def _up(call: Callable[[], Awaitable[T]]) -> T:
    """A read that waits out a service's restart."""
    return await _until_accepted(call, (grpc.StatusCode.UNAVAILABLE,))


WarmStart = Callable[[list[TaskRef], Path], Awaitable[Path | None]]
# Called with the stack still up once the run is over (a replay of the log, a report), before it stops.
BeforeStop = Callable[[Stack, LoopResult], Awaitable[None]]
# Called once the stack is up, before any task is built (e.g. to follow the log with a live view).
AfterStart = Callable[[Stack], Awaitable[None]]


async def run_loop(
    cfg: RunConfig,
    settings: Settings,
    *,
    say: Say = print,
    spec: HarnessSpec | None = None,
    warm_start: WarmStart | None = None,
    before_stop: BeforeStop | None = None,
    after_start: AfterStart | None = None,
) -> LoopResult:
    """Run ``cfg`` on the embedded stack of ``settings.data_dir`` (started and stopped here) end to end.

    Order: the stack without the trainer; tasks built; ``warm_start(tasks, folder)`` (an SFT on their reference
    solutions) may return the checkpoint the run starts from; the engines start on it, one per cell, and the
    cells are registered; then the trainer service starts with this run's ``trainer.toml``, and the loop runs."""
    from opengyre.models import checkpoint_info
    from opengyre.proxy.engine import EngineConfig, EngineProcess

    cfg.validate()
    if spec is None:
        spec = builtin_spec(*cfg.harness_args) if cfg.harness == "builtin" else HarnessSpec.from_toml(Path(cfg.harness))
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    loop = _Loop(cfg, settings, say, spec)
    res = loop.result
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(cfg.cells * cfg.cell_capacity + 8))
    env = {**scheduler_env(cfg), **await asyncio.to_thread(proxy_env, cfg.model)}
    stack = Stack(settings, services=["synth", "scheduler", "proxy"], env=env)
    engines: list[EngineProcess] = []
    halt = asyncio.Event()
    supervisor: asyncio.Task[None] | None = None
    try:
        await stack.start()
        # A service that dies mid-run is restarted (its projections resume from their positions); the driver's
        # calls wait out the restart.
        supervisor = asyncio.create_task(stack.supervise(halt), name="supervisor")
        say(f"stack: event log {stack.nats_url}, services {', '.join(stack.children)}")
        res.timings["start"] = time.monotonic() - started
        if after_start is not None:
            await after_start(stack)
        t0 = time.monotonic()
        synth = synth_pb2_grpc.SynthServiceStub(loop.channel(stack, "synth"))
        res.tasks = await loop.build_tasks(synth)
        res.timings["synthesis"] = time.monotonic() - t0
        init = None
        if warm_start is not None:
            t0 = time.monotonic()
            init = await warm_start(res.tasks, (settings.data_dir / "warm-start").resolve())
            res.timings["warm start"] = time.monotonic() - t0
        t0 = time.monotonic()
        engines = [
            EngineProcess(
                EngineConfig(
                    preset=cfg.model, checkpoint=init, seed=cfg.seed, threads=cfg.engine_threads,
                )
            )
            for _ in range(cfg.cells)
        ]  # fmt: skip
        for e in engines:
            await e.start(timeout=600)
        loop.engine_urls = [e.url for e in engines]
        # The scheduler calls "default" what engines serve until a step is published; from a warm start that is
        # the checkpoint's version (the calls are stamped with it), so the dispatch line says that.
        info = checkpoint_info(init) if init is not None else None
        loop.start_version = info["weight_version"] if info else "default"
        say(f"engines: {len(engines)} x {cfg.model} serving at {', '.join(loop.engine_urls)}")
        toml = tomli_w.dumps(trainer_settings(cfg, settings, loop.engine_urls, init))
        (settings.data_dir / "trainer.toml").write_text(toml)
        await stack.add_service("trainer")
        res.timings["engines and trainer start"] = time.monotonic() - t0
        await loop.run(stack)
        if before_stop is not None:
            await before_stop(stack, res)
        return res
    finally:
        halt.set()
        if supervisor is not None:
            await supervisor
        await loop.close()
        await stack.stop()
        for e in engines:
            await e.stop()
