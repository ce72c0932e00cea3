"""`opengyre demo`: the closed loop on the embedded stack, small enough for a laptop's CPU.

Skills become validated tasks (svc-synth); the policy is warm-started by SFT on the tasks' reference solutions;
then RL: the scheduler dispatches groups onto CPU rollout cells, the reference harness solves each execution in
its sandbox through the proxy, the trainer grades the preserved workspaces, trains, publishes weights and the
engines reload; the scheduler's policy moves the cells between rollout and training; tasks that got easy are
hardened. Finally every projection is rebuilt from the event log and compared with the live one.

Each run gets a fresh data dir (``<data-dir>/runs/<run>``), so ``opengyre events tail --data-dir ...`` and
``opengyre replay --data-dir ...`` can read it afterwards.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated

import typer

from opengyre.console import DataDirOpt, console, fail, settings_from

from ..config import Settings
from ..eventlog import EventLog, LogUnavailable
from ..report import LiveDashboard, RunSummary, summary_table
from ..runtime import DataDirBusy, DataDirUnusable, PortTaken, Stack, all_projections, grpc_channel
from ..v1 import common_pb2
from ._replay import replay_compare

if TYPE_CHECKING:
    from ..loop import LoopResult, RunConfig

__all__ = ["register"]

# The demo's skills: a handful, each with a procedural task whose reference solution is short.
DEMO_SKILLS = ["csv-report", "text-cleanup", "log-triage"]


@dataclass(frozen=True)
class DemoSize:
    """What makes learning visible on a 135M model in under 10 minutes on two cores (docs/loop.md, "The demo")."""

    steps: int = 3
    cells: int = 2
    # Groups of 4: after the warm start a task is solved by both members of a group of 2 or by neither (6 of 6
    # groups at temperature 0.5), which leaves GSPO nothing to train on; 4 rewards per task per step also fill the
    # hardening window (8) by step 2.
    group_size: int = 4
    # SFT: one optimizer step per reference conversation (3 tasks: 3 steps an epoch) until the policy reproduces
    # the solutions. 3 epochs of one batched step each at 5e-5 (the old default) left the nll at 0.93 and no call
    # was a tool call; 4 epochs at 2e-4 (nll 0.09) gave tool calls with near-miss solutions, all scored 0.
    sft_epochs: int = 6
    sft_lr: float = 2.5e-4
    lr: float = 2e-5
    max_turns: int = 3  # the reference episode is 2 calls: run the solution, submit
    # The reference calls are 174-226 tokens on the demo's tasks: 96 (the old default) cut every one of them.
    max_tokens: int = 256
    # Below 1 a nearly memorised solution is reproduced more often, and not always: a group needs mixed rewards to
    # train (0.5 was too sure: each group all 1 or all 0). The engine records the logprobs at this temperature and
    # the trainer uses the same one.
    temperature: float = 0.7


DEMO = DemoSize()


def demo_config(
    run: str, model: str, seed: int, size: DemoSize, sandbox: str = "", harness: str = "builtin"
) -> RunConfig:
    """The demo's run: its skills at level 0, one task each, every task a group per step (dispatched together).
    ``harness``: the built-in agent with the demo's flags, or a preset's real harness as pinned (it takes none)."""
    from ..loop import RunConfig

    capacity = -(-size.group_size * len(DEMO_SKILLS) // size.cells)  # a step's groups are dispatched together
    flags = ["--max-turns", str(size.max_turns), "--max-tokens", str(size.max_tokens), "--command-timeout", "20"]
    return RunConfig(
        run_id=run,
        seed=seed,
        skill_names=DEMO_SKILLS,
        tasks_per_skill=1,
        challenges=1,
        level=0,
        model=model,
        cells=size.cells,
        cell_capacity=capacity,
        group_size=size.group_size,
        groups_per_step=len(DEMO_SKILLS),
        steps=size.steps,
        policy="colocate",
        max_lag=0,
        timeout_s=240.0,
        lr=size.lr,
        sft_epochs=size.sft_epochs,
        sft_lr=size.sft_lr,
        harness=harness,
        harness_args=[*flags, "--temperature", str(size.temperature)] if harness == "builtin" else None,
        sandbox=sandbox,
    ).check()  # fmt: skip: a bad --model is one line, before anything starts


async def _pending(stack: Stack) -> int:
    total = 0
    for name, child in stack.children.items():
        stub_mod = __import__(f"opengyre.v1.{name}_pb2_grpc", fromlist=["x"])
        stub = getattr(stub_mod, f"{name.capitalize()}ServiceStub")
        async with grpc_channel(f"{stack.settings.host}:{child.port}", stack.settings.grpc_token()) as ch:
            st = await stub(ch).GetStatus(common_pb2.StatusRequest(), timeout=30)
        total += sum(p.pending for p in st.projections)
    return total


class _View:
    """The live dashboard beside the run, from the stack's start to the end of its last step."""

    def __init__(self, run: str) -> None:
        self.run = run
        self.halt = asyncio.Event()
        self.task: asyncio.Task[RunSummary] | None = None
        self.log: EventLog | None = None

    async def start(self, stack: Stack) -> None:
        self.log = await EventLog.connect(
            stack.nats_url, stack.settings.log, credentials=stack.admin_credentials, create=False
        )
        dash = LiveDashboard(self.log, console=console, title=f"opengyre demo {self.run}")
        self.task = asyncio.create_task(dash.run(self.halt), name="demo-dashboard")

    async def stop(self) -> RunSummary | None:
        """The run's summary once (None if the view never started); later calls only make sure it is closed."""
        self.halt.set()
        task, self.task = self.task, None
        try:
            return await task if task is not None else None
        finally:
            if self.log is not None and task is not None:
                await self.log.close()
                self.log = None


async def replay_matches(stack: Stack, settings: Settings) -> bool:
    """Every projection rebuilt from the log into a fresh store matches the live one, row for row."""
    for _ in range(1200):
        if await _pending(stack) == 0:
            break
        await asyncio.sleep(0.1)
    log = await EventLog.connect(stack.nats_url, settings.log, credentials=stack.admin_credentials, create=False)
    ok = True
    try:
        for proj in all_projections().values():
            rows, same, n = await replay_compare(proj, log, settings, None)
            count = sum(len(v) for v in rows.values())
            mark = "[green]matches[/]" if same else "[red]differs[/]"
            console.print(f"{proj.name:12} replayed {n} events into {count} rows: {mark}")
            ok = ok and bool(same)
    finally:
        await log.close()
    return ok


def demo(
    data_dir: DataDirOpt = None,
    model: Annotated[str, typer.Option(help="The policy: smollm2-135m (pretrained), tiny, small, a folder")] = (
        "smollm2-135m"
    ),
    steps: Annotated[int, typer.Option(min=1, help="RL steps")] = DEMO.steps,
    cells: Annotated[int, typer.Option(min=1, max=4, help="CPU rollout cells")] = DEMO.cells,
    group_size: Annotated[int, typer.Option(min=2, help="Executions per task per step")] = DEMO.group_size,
    sft_epochs: Annotated[int, typer.Option(min=0, help="Warm-start SFT epochs (0: none)")] = DEMO.sft_epochs,
    sft_lr: Annotated[float, typer.Option(min=0.0, help="Warm-start SFT learning rate")] = DEMO.sft_lr,
    lr: Annotated[float, typer.Option(min=0.0, help="RL learning rate")] = DEMO.lr,
    max_turns: Annotated[int, typer.Option(min=1, help="The reference harness's turns per episode")] = (DEMO.max_turns),
    max_tokens: Annotated[int, typer.Option(min=8, help="Tokens per model call")] = DEMO.max_tokens,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature of the rollouts")] = (
        DEMO.temperature
    ),
    seed: Annotated[int, typer.Option(help="Seed of the tasks, the engines and the trainer")] = 7,
    sandbox: Annotated[
        str,
        typer.Option(help="Sandbox backend: namespace, none (no isolation); default $OPENGYRE_SANDBOX or namespace"),
    ] = "",
    harness: Annotated[
        str,
        typer.Option(
            help="The harness: builtin (the reference agent), or a real one, unmodified, where installed (make "
            "harnesses): claude-code, codex, opencode, mini-swe-agent, openai-agents"
        ),
    ] = "builtin",
) -> None:
    """The main job on the embedded stack: synthesize, warm-start, roll out, train, harden, replay."""
    from ..loop import RunConfigError, run_loop, sft_warm_start

    run = f"demo-{uuid.uuid4().hex[:6]}"
    base = settings_from(data_dir)
    settings = settings_from(base.data_dir / "runs" / run)
    size = DemoSize(steps, cells, group_size, sft_epochs, sft_lr, lr, max_turns, max_tokens, temperature)
    if harness != "builtin" and (max_turns, max_tokens, temperature) != (
        DEMO.max_turns,
        DEMO.max_tokens,
        DEMO.temperature,
    ):
        # A real harness runs as pinned: it decides its own turns, output length and sampling.
        raise fail(f"--max-turns, --max-tokens and --temperature are the built-in harness's; {harness} takes none")
    try:
        cfg = demo_config(run, model, seed, size, sandbox, harness)
    except RunConfigError as exc:
        raise fail(str(exc)) from exc
    warm = (
        sft_warm_start(
            model,
            epochs=sft_epochs,
            lr=sft_lr,
            seed=seed,
            max_tokens=max_tokens,
            say=console.print,
            cache=base.data_dir / "cache" / "warm-start",  # across runs: each demo run has its own data dir
        )
        if sft_epochs
        else None
    )
    replayed: list[bool] = []
    # The live view and the report read the event log only (docs/report.md): the run's data dir is its own, so
    # its whole log is this run.
    view = _View(run)

    async def finish(stack: Stack, result: LoopResult) -> None:
        from ..report import write_html  # loads matplotlib: only when a report is written, not on every command

        summary = await view.stop()
        if summary is not None:
            console.rule("[bold]summary (from the event log)[/]")
            console.print(summary_table(summary))
            html = write_html(summary, settings.data_dir / "report.html")
            console.print(f"HTML report with plots: {html}")
        console.rule("[bold]replay: every projection rebuilt from the event log[/]")
        replayed.append(await replay_matches(stack, settings))

    async def main() -> LoopResult:
        try:
            return await run_loop(
                cfg, settings, say=console.print, warm_start=warm, after_start=view.start, before_stop=finish
            )
        finally:
            await view.stop()

    console.rule(f"[bold]opengyre demo: run {run} ({model}, harness {harness}) in {settings.data_dir}[/]")
    started, cpu0 = time.monotonic(), os.times()
    try:
        result = asyncio.run(main())
    except (LogUnavailable, DataDirBusy, DataDirUnusable, PortTaken) as exc:
        raise fail(str(exc)) from exc
    wall, cpu1 = time.monotonic() - started, os.times()
    console.rule("[bold]where the time went[/]")
    for phase, secs in result.timings.items():
        console.print(f"{phase:28} {secs:7.1f} s")
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    cpu = cpu1.user + cpu1.system + cpu1.children_user + cpu1.children_system - sum(cpu0[:4])
    console.print(f"{'total':28} {wall:7.1f} s wall ({cpu:.0f} CPU-s in this process's tree; load {load})")
    scored = [f.score for f in result.finished if f.score is not None]
    trained = [s for s in result.steps if s.n_trained > 0]
    published = sorted({s.weight_version for s in result.steps if s.weight_version})
    console.print(
        f"{len(result.finished)} executions ({len(scored)} scored, mean reward "
        f"{(sum(scored) / len(scored)) if scored else 0.0:.3f}), {len(trained)} of {len(result.steps)} step(s) "
        f"trained on a signal, weights published: {', '.join(published) or 'none'}, "
        f"{result.hardened} task version(s) hardened"
    )
    for step, rewards in sorted(rewards_per_step(result).items()):
        console.print(f"  step {step}: mean reward {sum(rewards) / len(rewards):.3f} over {len(rewards)} scored")
    console.print(f"\nTry: [bold]opengyre events tail --data-dir {settings.data_dir}[/]")
    if not (replayed and replayed[0]):
        raise typer.Exit(1)


def rewards_per_step(result: LoopResult) -> dict[int, list[float]]:
    """The scored executions' rewards by the step they were dispatched for."""
    out: dict[int, list[float]] = {}
    for f in result.finished:
        if f.score is not None:
            out.setdefault(f.assignment.step, []).append(f.score)
    return out


def register(app: typer.Typer) -> None:
    app.command()(demo)
