"""The rollout driver: the closed loop on the embedded stack, as a client of the services.

svc-synth ingests skills and builds validated tasks; CPU engines start, one per cell, and are registered with the
scheduler (the proxy routes to them from the cell events); for each step the scheduler places the step's groups
on rollout cells and appends ``execution-dispatched``; each execution runs the harness in its sandbox through the
proxy and ends with the trainer grading its workspace (``execution-finished``); the trainer service trains as
soon as a step's groups are complete (its ``trainer.toml``, written here), publishes weights and reloads the
engines; the scheduler's policy moves cells between rollout and training; svc-synth hardens task versions that
got easy, and later groups use the newest version. Nothing here appends an event: each has its owning service.

Resumable (``_Loop.resume``): a driver started again on the same data dir reads from the event log what the
killed one dispatched; an execution without an outcome ends once as abandoned, re-dispatched groups are answered
with their old members, and cells move to the new engines (``cell-engine-changed``). Streaming: groups go out one
by one as the cells have room. ``attach``: the same loop on a deployment already running (``_deployment``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc

from opengyre.config import Settings
from opengyre.eventlog import EventLog
from opengyre.events import ExecutionDispatched, ExecutionFinished
from opengyre.harness import HarnessSpec
from opengyre.retry import backoff
from opengyre.runtime import Stack, grpc_channel
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
from ._deployment import (
    DeploymentMismatch,
    Services,
    deployment_env,
    record_engines,
    served_name,
    stop_leftover_engines,
    write_trainer_toml,
)
from ._rollout import Assignment, Finished, end_abandoned, roll_out
from ._waits import AWAY, NOT_NOW, WAITS, NotYet, not_yet_or, until_accepted, until_caught_up, up

if TYPE_CHECKING:
    from opengyre.engine import EngineProcess

__all__ = ["AfterStart", "BeforeStop", "LoopResult", "TaskRef", "WarmStart", "run_loop"]

log = logging.getLogger(__name__)

Say = Callable[[str], None]
ENGINE_WAIT_S = 120.0


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


class _Loop:
    def __init__(self, cfg: RunConfig, settings: Settings, say: Say, spec: HarnessSpec) -> None:
        self.cfg, self.settings, self.say, self.spec = cfg, settings, say, spec
        self.result = LoopResult()
        self.channels: list[grpc.aio.Channel] = []
        self.engine_urls: list[str] = []
        self.settled = asyncio.Event()  # every step trained, the cells back in rollout
        self.start_version = "default"  # what the engines serve before any step is published (a warm start's)

    def channel(self, services: Services, name: str) -> grpc.aio.Channel:
        ch = grpc_channel(f"{services.host}:{services.ports[name]}", self.settings.grpc_token())
        self.channels.append(ch)
        return ch

    async def start_engines(self, init: Path | None) -> list[EngineProcess]:
        """One CPU engine per cell, on ``init`` (else the model's own weights); an earlier driver's are stopped.
        With the run's ``engines`` (serving already, elsewhere) none is started: they are the cells' engines."""
        from opengyre.engine import EngineConfig, EngineProcess
        from opengyre.models import checkpoint_info

        cfg = self.cfg
        if cfg.engines:
            await asyncio.gather(*(_serving(url) for url in cfg.engines))
            self.engine_urls = list(cfg.engines)
            self.say(f"engines: {len(cfg.engines)} given, serving at {', '.join(self.engine_urls)}")
            return []
        engines = [
            EngineProcess(EngineConfig(preset=cfg.model, checkpoint=init, seed=cfg.seed, threads=cfg.engine_threads))
            for _ in range(cfg.cells)
        ]
        await asyncio.to_thread(stop_leftover_engines, self.settings.data_dir)
        try:
            for e in engines:
                await e.start(timeout=600)
        except BaseException:
            for e in engines:
                await e.stop()
            raise
        self.engine_urls = [e.url for e in engines]
        record_engines(self.settings.data_dir, engines)
        # The scheduler calls "default" what engines serve until a step is published; from a warm start that is
        # the checkpoint's version (the calls are stamped with it), so the dispatch line says that.
        info = checkpoint_info(init) if init is not None else None
        self.start_version = info["weight_version"] if info else "default"
        self.say(f"engines: {len(engines)} x {cfg.model} serving at {', '.join(self.engine_urls)}")
        return engines

    async def check_deployment(self, services: Services) -> None:
        """A running deployment serves this run only if its scheduler runs the run's policy in auto mode and its
        trainer trains this run (both read their settings at start: ``opengyre train env`` prints them)."""
        sched = scheduler_pb2_grpc.SchedulerServiceStub(self.channel(services, "scheduler"))
        trainer = trainer_pb2_grpc.TrainerServiceStub(self.channel(services, "trainer"))
        st = await sched.GetState(scheduler_pb2.GetStateRequest(), timeout=30)
        hint = "start it with this run's settings (opengyre train env RUN.toml, docs/loop.md)"
        if st.policy != self.cfg.policy or not st.auto:
            mode = "auto" if st.auto else "advice only"
            raise DeploymentMismatch(
                f"the running scheduler runs policy {st.policy} ({mode}), not {self.cfg.policy} (auto); {hint}"
            )
        try:
            got = await trainer.GetEngineVersions(trainer_pb2.GetEngineVersionsRequest(), timeout=30)
        except grpc.aio.AioRpcError as exc:
            if exc.code() != grpc.StatusCode.FAILED_PRECONDITION:
                raise
            raise DeploymentMismatch(f"the running trainer does not train (no trainer.toml); {hint}") from exc
        if got.run_id != self.cfg.run_id:
            raise DeploymentMismatch(f"the running trainer trains run {got.run_id}, not {self.cfg.run_id}; {hint}")

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
                if exc.code() != grpc.StatusCode.ALREADY_EXISTS:
                    raise
                # A resumed run: the cell was registered by the driver before; its engine is a new one now.
                moved = scheduler_pb2.SetCellEngineRequest(
                    cell_id=req.cell_id, engine_url=url, reason="the run resumed with a new engine"
                )
                await until_accepted(
                    functools.partial(sched.SetCellEngine, moved, timeout=60), NOT_NOW, f"moving {req.cell_id}"
                )
        kind = "" if self.cfg.engines else "CPU "
        self.say(
            f"cells: {len(self.engine_urls)} {kind}cells of {self.cfg.cell_capacity} registered ({self.cfg.policy})"
        )

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
        built = await until_accepted(
            lambda: synth.BuildTasks(req, timeout=600), (grpc.StatusCode.NOT_FOUND,), "building tasks"
        )
        ok = [t for t in built.tasks if t.ok]
        self.say(f"synth: {len(ids)} skill(s) -> {len(built.tasks)} task(s), {len(ok)} validated")
        if not ok:
            raise RuntimeError("no task passed validation: nothing to train on")
        return [_task_ref(t.task_id, t.version, Path(t.task_dir)) for t in ok]

    async def resume(
        self, services: Services, synth: synth_pb2_grpc.SynthServiceAsyncStub,
        proxy: proxy_pb2_grpc.ProxyServiceAsyncStub, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, workdir: Path,
    ) -> set[str]:  # fmt: skip
        """What an earlier driver of this run left, read from the event log: every execution it dispatched that
        has no ``execution-finished`` ends now as abandoned (``end_abandoned``: its harness went with that
        driver). Returns every execution of the run dispatched so far, each now with exactly one outcome: the
        loop never runs them again (a re-dispatched group is answered with these members)."""
        prefix = f"{self.cfg.run_id}-s"
        dispatched: dict[str, ExecutionDispatched] = {}
        finished: set[str] = set()
        log = await EventLog.connect(
            services.nats_url, self.settings.log, credentials=services.nats_credentials, create=False
        )
        try:
            async for _, e in log.events(ExecutionDispatched, ExecutionFinished):
                if isinstance(e, ExecutionDispatched) and e.execution_id.startswith(prefix):
                    dispatched[e.execution_id] = e
                elif isinstance(e, ExecutionFinished) and e.execution_id.startswith(prefix):
                    finished.add(e.execution_id)
        finally:
            await log.close()
        lost = [e for x, e in dispatched.items() if x not in finished]
        if dispatched:
            self.say(
                f"resume: {len(dispatched)} execution(s) dispatched before, {len(dispatched) - len(lost)} finished, "
                f"{len(lost)} abandoned"
            )

        async def end(e: ExecutionDispatched) -> None:
            t = await self.version(synth, e.task_id, e.task_version)
            a = Assignment(
                e.execution_id, e.group_id, e.task_id, e.task_version, e.cell_id or "", e.step, t.task_dir,
                t.instruction,
            )  # fmt: skip
            ws = workdir / e.execution_id / "app"
            await asyncio.to_thread(ws.mkdir, parents=True, exist_ok=True)  # it may not have started at all
            why = "abandoned: the driver running it stopped before it ended; ended when the run resumed"
            r = await end_abandoned(proxy, trainer, a, ws, why)
            self.say(f"  {e.execution_id} on {a.cell_id}: abandoned -> {r.status} ({r.failure_class})")

        await asyncio.gather(*(end(e) for e in lost))
        return set(dispatched)

    async def version(self, synth: synth_pb2_grpc.SynthServiceAsyncStub, task_id: str, version: int) -> TaskRef:
        req = synth_pb2.GetLineageRequest(task_id=task_id)
        lineage = await up(lambda: synth.GetLineage(req, timeout=60))
        for v in lineage.versions:
            if v.version == version and v.task_dir:
                return _task_ref(task_id, version, Path(v.task_dir))
        raise RuntimeError(f"task {task_id} has no version {version} with a task folder")

    async def current(self, synth: synth_pb2_grpc.SynthServiceAsyncStub, task: TaskRef) -> TaskRef:
        """The task's newest validated version (hardening adds versions while the run goes on)."""
        req = synth_pb2.GetLineageRequest(task_id=task.task_id)
        lineage = await up(lambda: synth.GetLineage(req, timeout=60))
        valid = [v for v in lineage.versions if v.validated == "true" and v.task_dir]
        if not valid:
            return task
        v = max(valid, key=lambda v: v.version)
        return task if v.version == task.version else _task_ref(task.task_id, v.version, Path(v.task_dir))

    # --- the loop ----------------------------------------------------------------------------------------

    async def engines_serve(self, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, want: str) -> None:
        """On-policy (max_lag 0): a step's rollouts wait until every engine serves the weights the step was
        dispatched on. The trainer reloads the engines after each step and brings a stale one up to date, so it
        is the one source of which engine serves what (``GetEngineVersions``); nothing here asks an engine."""
        req = trainer_pb2.GetEngineVersionsRequest()
        deadline = time.monotonic() + ENGINE_WAIT_S
        lagging: list[str] = []
        try:
            async for attempt in backoff(
                f"engines to serve {want}", first_s=0.1, max_s=1.0, retry_if=not_yet_or(grpc.StatusCode.UNAVAILABLE),
                until=lambda: time.monotonic() > deadline, logger=WAITS,
            ):  # fmt: skip
                with attempt:
                    got = await trainer.GetEngineVersions(req, timeout=30)
                    if not got.latest_weight_version:
                        return  # nothing published yet: every engine serves the starting weights
                    # The step's weights, or newer ones (an engine the trainer already moved on is not stale).
                    ok = {want, got.latest_weight_version}
                    by_url = {e.url: e for e in got.engines}
                    lagging = [
                        u for u in self.engine_urls
                        if (e := by_url.get(u)) is None or (e.serving not in ok and e.failed_version not in ok)
                    ]  # fmt: skip
                    for e in got.engines:
                        if e.url in self.engine_urls and e.failed_version in ok:  # its later calls are not trained
                            log.warning("engine %s failed to load %s: %s", e.url, e.failed_version, e.message)
                    if lagging:
                        raise NotYet(f"{len(lagging)} engine(s) do not serve {want} yet")
        except NotYet:
            log.warning("engines %s do not serve %s after %.0f s; rolling out anyway", lagging, want, ENGINE_WAIT_S)

    async def dispatch(
        self, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub, step: int, k: int, t: TaskRef
    ) -> scheduler_pb2.DispatchGroupsReply:
        """Group ``k`` of ``step``, once the policy admits the step and the rollout cells have room for it."""
        group = scheduler_pb2.GroupRequest(
            group_id=f"{self.cfg.run_id}-s{step}-g{k}", task_id=t.task_id, task_version=t.version,
            group_size=self.cfg.group_size,
        )  # fmt: skip
        req = scheduler_pb2.DispatchGroupsRequest(groups=[group], timeout_s=self.cfg.timeout_s)
        return await until_accepted(
            lambda: sched.DispatchGroups(req, timeout=60), NOT_NOW, f"dispatching step {step} group {k}"
        )

    async def follow(
        self, trainer: trainer_pb2_grpc.TrainerServiceAsyncStub, sched: scheduler_pb2_grpc.SchedulerServiceAsyncStub
    ) -> None:
        """Follow the scheduler's state as it changes (``WatchState``): one plain line per completed training
        step (the hook a live dashboard replaces), and ``settled`` set once every step of the run is trained
        and the cells are back in rollout (the policy returns them once nothing is left)."""
        seen = 0
        req = scheduler_pb2.WatchStateRequest()
        steps_req = trainer_pb2.ListStepsRequest(run_id=self.cfg.run_id)
        async for attempt in backoff(
            "following the scheduler's state", first_s=0.1, max_s=2.0, retry_if=not_yet_or(*AWAY), logger=WAITS
        ):
            with attempt:
                async for st in sched.WatchState(req):
                    if st.trained_step > seen:
                        # The trainer's projection may fold its own step a moment after the scheduler's.
                        steps = await until_caught_up(
                            lambda: trainer.ListSteps(steps_req, timeout=30),
                            functools.partial(_has_steps, want=st.trained_step),
                        )
                        roles = ", ".join(f"{c.cell_id.rsplit('-', 1)[-1]}={c.role}" for c in st.cells)
                        for s in steps.steps[seen:]:
                            reward = f"{s.reward_mean:.3f}" if s.has_reward_mean else "-"
                            self.say(
                                f"step {s.step}: trained {s.n_trained}, dropped {s.n_dropped}, reward {reward}, "
                                f"loss {s.loss:.4f}, weights {s.weight_version or '(none)'}; cells {roles}"
                            )
                        seen = len(steps.steps)
                        self.result.steps = list(steps.steps)
                    if seen >= self.cfg.steps and st.cells and all(c.role == "rollout" for c in st.cells):
                        self.settled.set()
                raise NotYet("the scheduler's state stream ended")  # a restarted scheduler: follow it again

    async def run(self, services: Services) -> LoopResult:
        cfg, res = self.cfg, self.result
        synth = synth_pb2_grpc.SynthServiceStub(self.channel(services, "synth"))
        sched = scheduler_pb2_grpc.SchedulerServiceStub(self.channel(services, "scheduler"))
        trainer = trainer_pb2_grpc.TrainerServiceStub(self.channel(services, "trainer"))
        proxy = proxy_pb2_grpc.ProxyServiceStub(self.channel(services, "proxy"))
        await self.register_cells(sched)
        tasks = res.tasks
        model = served_name(cfg.model)
        workdir = (self.settings.data_dir / "rollouts").resolve()
        before = await self.resume(services, synth, proxy, trainer, workdir)
        follower = asyncio.create_task(self.follow(trainer, sched), name="follow-scheduler")
        running: set[asyncio.Task[Finished]] = set()
        t0 = time.monotonic()
        try:
            # Streaming across groups: each group goes out on its own as soon as the cells have room for it (a
            # step's later groups start while its earlier ones run; a step larger than the cells still runs), and
            # the next step's as soon as the policy admits it. The tasks take turns, one group each.
            for n in range(cfg.steps * cfg.groups_per_step):
                step, k = n // cfg.groups_per_step + 1, n % cfg.groups_per_step
                chosen = [await self.current(synth, tasks[n % len(tasks)])]
                reply = await self.dispatch(sched, step, k, chosen[0])
                by_id = {t.task_id: t for t in chosen}
                self.say(
                    f"dispatch: step {reply.step}, {len(reply.executions)} executions of "
                    f"{', '.join(f'{t.task_id} v{t.version}' for t in chosen)} on weights "
                    f"{self.start_version if reply.weight_version == 'default' else reply.weight_version}"
                )
                todo = [e for e in reply.executions if e.execution_id not in before]
                if len(todo) < len(reply.executions):
                    self.say(f"  {len(reply.executions) - len(todo)} of them ended before the resume: not run again")
                if todo and cfg.max_lag == 0 and reply.step > 1:
                    await self.engines_serve(trainer, reply.weight_version)
                for e in todo:
                    t = by_id[e.task_id]
                    a = Assignment(
                        e.execution_id, e.group_id, e.task_id, t.version, e.cell_id, reply.step, t.task_dir,
                        t.instruction,
                    )  # fmt: skip
                    job = asyncio.create_task(
                        roll_out(a, proxy=proxy, trainer=trainer, spec=self.spec, model=model, workdir=workdir,
                                 timeout_s=cfg.timeout_s, sandbox=cfg.sandbox or None,
                                 group_memory_mb=cfg.group_memory_mb)
                    )  # fmt: skip
                    running.add(job)
                    job.add_done_callback(lambda j: self._done(j, running))
            if running:
                await asyncio.wait(set(running))
            res.timings["rollout"] = time.monotonic() - t0
            t0 = time.monotonic()
            await self.trained(follower)
            res.timings["training tail"] = time.monotonic() - t0
            res.hardened = await self.harden(synth)
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            for j in running:
                j.cancel()
        return res

    async def synth_caught_up(self, synth: synth_pb2_grpc.SynthServiceAsyncStub) -> None:
        await until_caught_up(
            lambda: synth.GetStatus(common_pb2.StatusRequest(), timeout=30),
            lambda status: all(p.pending == 0 for p in status.projections),
        )

    async def harden(self, synth: synth_pb2_grpc.SynthServiceAsyncStub) -> int:
        """Once the synth's projections have folded every outcome, harden what got easy (its worker does so on
        its own while the run goes on; this is the last pass before the stack stops). Returns the versions
        hardened in the whole run."""
        await self.synth_caught_up(synth)
        done = await up(lambda: synth.HardenTasks(synth_pb2.HardenTasksRequest(), timeout=600))
        for h in done.hardened:
            self.say(f"hardened {h.task_id} v{h.from_version} -> v{h.to_version}: {h.reason}")
        await self.synth_caught_up(synth)
        listed = await up(lambda: synth.ListTasks(synth_pb2.ListTasksRequest(), timeout=60))
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

    async def trained(self, follower: asyncio.Task[None], bound_s: float = 900.0) -> None:
        """Every step trained, and the cells back from training (``follow`` says so from the state stream)."""
        settled = asyncio.create_task(self.settled.wait())
        try:
            await asyncio.wait({settled, follower}, timeout=bound_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            settled.cancel()
        if follower.done():
            follower.result()  # its error, if it failed
        if not self.settled.is_set():
            raise TimeoutError(f"the trainer did not complete {self.cfg.steps} step(s) within {bound_s:.0f} s")


async def _serving(url: str) -> None:
    """An engine the run was given answers SGLang's ``GET /model_info`` (it is up, and speaks the protocol)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=30) as client:
            r = await client.get(url.rstrip("/") + "/model_info")
        r.raise_for_status()
        r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise RuntimeError(f"engine {url} does not answer GET /model_info: {exc}") from exc


def _task_ref(task_id: str, version: int, task_dir: Path) -> TaskRef:
    return TaskRef(task_id, version, task_dir, (task_dir / "instruction.md").read_text())


def _has_steps(reply: trainer_pb2.ListStepsReply, want: int) -> bool:
    return len(reply.steps) >= want


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
    attach: bool = False,
) -> LoopResult:
    """Run ``cfg`` on the embedded stack of ``settings.data_dir`` (started and stopped here) end to end.

    Order: the stack without the trainer; tasks built; ``warm_start(tasks, folder)`` (an SFT on their reference
    solutions) may return the checkpoint the run starts from; the engines start on it, one per cell, and the
    cells are registered; then the trainer service starts with this run's ``trainer.toml``, and the loop runs.

    ``attach``: drive the run on the deployment already running on the data dir (``opengyre up``, started with
    this run's service settings, ``opengyre train env``) instead: nothing is started but the engines, and the
    services keep running after the run. A warm start and the stack hooks need the embedded stack."""
    cfg.check()
    if cfg.engines and warm_start is not None:
        raise ValueError("a warm start's weights load into engines the run starts; the run was given its engines")
    if spec is None:
        spec = cfg.harness_spec()
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(cfg.cells * cfg.cell_capacity + 8))
    loop = _Loop(cfg, settings, say, spec)
    if attach:
        if warm_start is not None or before_stop is not None or after_start is not None:
            raise ValueError("a warm start and stack hooks need the embedded stack (attach=False)")
        return await _run_attached(loop)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    res = loop.result
    env = await asyncio.to_thread(deployment_env, cfg)
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
        synth = synth_pb2_grpc.SynthServiceStub(loop.channel(Services.of(stack), "synth"))
        res.tasks = await loop.build_tasks(synth)
        res.timings["synthesis"] = time.monotonic() - t0
        init = None
        if warm_start is not None:
            t0 = time.monotonic()
            init = await warm_start(res.tasks, (settings.data_dir / "warm-start").resolve())
            res.timings["warm start"] = time.monotonic() - t0
        t0 = time.monotonic()
        engines = await loop.start_engines(init)
        write_trainer_toml(cfg, settings, loop.engine_urls, init)
        await stack.add_service("trainer")
        res.timings["engines and trainer start"] = time.monotonic() - t0
        await stack.watch(loop.run(Services.of(stack)))  # a service that keeps failing the same way ends the run
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


async def _run_attached(loop: _Loop) -> LoopResult:
    """The run on a deployment already running: its services as they are, checked to serve this run first."""
    res = loop.result
    started = time.monotonic()
    services = await asyncio.to_thread(Services.running, loop.settings)
    engines: list[EngineProcess] = []
    try:
        await loop.check_deployment(services)
        loop.say(f"attached: event log {services.nats_url}, services {', '.join(sorted(services.ports))}")
        res.timings["start"] = time.monotonic() - started
        t0 = time.monotonic()
        res.tasks = await loop.build_tasks(synth_pb2_grpc.SynthServiceStub(loop.channel(services, "synth")))
        res.timings["synthesis"] = time.monotonic() - t0
        t0 = time.monotonic()
        engines = await loop.start_engines(None)
        res.timings["engines start"] = time.monotonic() - t0
        return await loop.run(services)
    finally:
        await loop.close()
        for e in engines:
            await e.stop()
