"""Commands the trainer adds to ``opengyre``: ``opengyre train run|sft|score|preview|steps`` (``train loop|env``, which
drive the whole loop, are the apps layer's: ``opengyre.cli``).

Heavy imports (torch, megatron) happen inside the commands: ``opengyre --help`` stays fast.
"""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from opengyre.console import DataDirOpt, DbUrlOpt, NatsUrlOpt, console, fail, log_session, settings_from

__all__ = ["register"]

train_app = typer.Typer(
    help="Train the policy: online RL from the log, SFT warm starts, scoring.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(train_app, name="train")


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _engine(db_url: str):  # type: ignore[no-untyped-def]
    from opengyre.store import create_db_engine, migrate

    eng = create_db_engine(db_url)
    migrate(eng)
    return eng


@train_app.command("run")
def run_command(
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
    run_id: Annotated[str, typer.Option(help="Run name: weight versions are <run>-s<step>")] = "default",
    model: Annotated[str, typer.Option(help="tiny, small, smollm2-135m, a model folder or a .gguf")] = "tiny",
    backend: Annotated[str, typer.Option(help="torch or megatron")] = "torch",
    algorithm: Annotated[
        str,
        typer.Option(
            help="gspo; grpo (token-level, clip 0.2/0.2); dapo (clip 0.2/0.28, token-mean loss, dynamic sampling); sft"
        ),
    ] = "gspo",
    max_paths: Annotated[int, typer.Option(help="Jmax: paths per execution; 0 = all (ablation)")] = 5,
    group_size: Annotated[int, typer.Option(help="Members per group when the dispatch did not say")] = 16,
    groups_per_step: Annotated[int, typer.Option(help="Complete groups per optimizer step")] = 1,
    lr: Annotated[float, typer.Option(help="Learning rate")] = 1e-5,
    micro_batch_tokens: Annotated[int, typer.Option(help="Padded tokens per micro-batch")] = 4096,
    max_staleness: Annotated[int, typer.Option(help="Filter executions staler than this (-1: keep all)")] = -1,
    engine: Annotated[list[str] | None, typer.Option("--engine", help="Engine URL to hot-reload (repeat)")] = None,
    init_checkpoint: Annotated[Path | None, typer.Option(help="Start from this checkpoint (an SFT warm start)")] = None,
    checkpoint_dir: Annotated[
        Path | None, typer.Option(help="Where checkpoints go [default: <data-dir>/checkpoints]")
    ] = None,
    steps: Annotated[int, typer.Option(help="Stop after this many steps (0: run until Ctrl-C)")] = 0,
    streaming: Annotated[bool, typer.Option(help="Start each step on the first ready group")] = False,
    satellites: Annotated[int, typer.Option(help="In-process satellite workers (needs --streaming)")] = 0,
    tp: Annotated[int, typer.Option(help="Tensor parallel size (megatron; launch tp*pp ranks with torchrun)")] = 1,
    pp: Annotated[int, typer.Option(help="Pipeline parallel size (megatron; launch tp*pp ranks with torchrun)")] = 1,
    fold: Annotated[
        bool | None,
        typer.Option(
            "--fold/--no-fold",
            help="Fold the trainer projection in this process [default: only when no stack runs the trainer service]",
        ),
    ] = None,
) -> None:
    """Online RL: wait for complete groups, train one step per batch, publish weights, reload engines."""
    from opengyre.projection import ProjectionRunner

    from ._config import TrainerConfig
    from ._loop import OnlineTrainer
    from ._projection import TrainerProjection
    from ._store import TrainerStore

    settings = settings_from(data_dir, nats_url, db_url)
    if fold is None:
        # Two processes folding one projection would fight over its durable consumer: leave it to the service.
        from opengyre.runtime import stack_alive

        fold = stack_alive(settings) is None
    cfg = TrainerConfig(
        run_id=run_id,
        model=model,
        backend=backend,
        algorithm=algorithm,
        max_paths=max_paths or None,
        group_size=group_size,
        groups_per_step=groups_per_step,
        lr=lr,
        micro_batch_tokens=micro_batch_tokens,
        max_staleness=None if max_staleness < 0 else max_staleness,
        engines=list(engine or []),
        init_checkpoint=init_checkpoint,
        checkpoint_dir=checkpoint_dir or settings.data_dir / "checkpoints",
        streaming=streaming,
        satellites=satellites,
        tp=tp,
        pp=pp,
    )
    try:
        cfg.validate()
    except ValueError as exc:
        raise fail(str(exc)) from exc
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        # Launched by torchrun for a model-parallel run: rank 0 leads, the others follow in lockstep.
        import torch.distributed as dist

        from ._follower import follow

        dist.init_process_group("nccl" if _cuda() else "gloo")
        if dist.get_rank() != 0:
            console.print(f"rank {dist.get_rank()}: following rank 0")
            follow(cfg)
            return

    async def main() -> None:
        settings.ensure_store_dir()
        eng = await asyncio.to_thread(_engine, settings.store_url("trainer"))
        async with log_session(settings) as log:
            stop = asyncio.Event()
            tasks = []
            if fold:
                runner = ProjectionRunner(TrainerProjection(), log, eng)
                tasks.append(asyncio.create_task(runner.run(stop)))
            trainer = OnlineTrainer(cfg, TrainerStore(eng), log)
            console.print(f"training run [bold]{run_id}[/] from step {trainer.step_no + 1} ({backend}, {algorithm})")
            if cfg.metrics_port is not None:
                console.print(f"/metrics on port {trainer.serve_metrics()}")
            try:
                await trainer.run(stop, max_steps=steps or None)
            finally:
                trainer.close()
                stop.set()
                await asyncio.gather(*tasks, return_exceptions=True)
                eng.dispose()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        console.print("stopped")


@train_app.command("sft")
def sft_command(
    data: Annotated[
        Path,
        typer.Argument(
            help='JSONL of conversations, one {"messages": [...], "tools": [...]} a line (OpenAI\'s fine-tuning '
            "format: assistant tool_calls and tool results rendered as the proxy renders them), or Harbor task "
            "dirs' parent"
        ),
    ],
    out: Annotated[Path, typer.Option(help="Checkpoint folder to write")],
    model: Annotated[str, typer.Option(help="tiny, small, smollm2-135m, a model folder or a .gguf")] = "tiny",
    backend: Annotated[str, typer.Option(help="torch or megatron")] = "torch",
    epochs: Annotated[int, typer.Option()] = 3,
    batch_size: Annotated[int, typer.Option()] = 8,
    lr: Annotated[float | None, typer.Option(help="Default: 1e-3 for a preset, 1e-5 for a pretrained model")] = None,
    seed: Annotated[int, typer.Option()] = 0,
    version: Annotated[str, typer.Option(help="Weight version stamped on the checkpoint")] = "sft",
) -> None:
    """Warm-start a policy on golden trajectories (conversations with tools, or Harbor tasks' reference solutions)."""
    from opengyre.models import resolve_model

    from ._sft import Conversation, golden_from_task, read_conversations, sft_warm_start

    convos: list[Conversation]
    if data.is_dir():
        convos = [golden_from_task(t) for t in sorted(data.iterdir()) if (t / "solution" / "solve.sh").exists()]
    elif data.is_file():
        try:
            convos = list(read_conversations(data))
        except ValueError as exc:
            raise fail(str(exc)) from exc
    else:
        raise fail(f"{data} does not exist")
    if not convos:
        raise fail(f"no golden trajectories in {data}")
    source = resolve_model(model, log=console.print)
    try:
        run = sft_warm_start(
            source,
            convos,
            out,
            backend=backend,
            epochs=epochs,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            version=version,
        )
    except ValueError as exc:  # a conversation the gateway would refuse: its 400 message
        raise fail(str(exc)) from exc
    console.print(
        f"SFT on {len(convos)} trajectories, {len(run.steps)} steps: nll {run.steps[0].metrics['nll']:.3f} -> "
        f"{run.steps[-1].metrics['nll']:.3f}; checkpoint {out} ({version})"
    )


@train_app.command("score")
def score_command(
    execution_id: Annotated[str, typer.Argument()],
    task: Annotated[Path, typer.Option(help="Harbor task directory (tests/test.sh)")],
    workspace: Annotated[Path, typer.Option(help="The execution's preserved workspace")],
    timed_out: Annotated[bool, typer.Option(help="The execution hit its time limit (it is still graded)")] = False,
    exit_code: Annotated[int | None, typer.Option(help="How the agent process ended")] = None,
    failure: Annotated[
        str | None, typer.Option(help="A failure the runtime observed itself: oom, sandbox, engine, timeout, network")
    ] = None,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    dry_run: Annotated[bool, typer.Option(help="Print the outcome without recording it")] = False,
) -> None:
    """Grade a finished execution on its preserved workspace and record ExecutionFinished."""
    from opengyre.grading import evaluator_from_env

    from ._failures import REPORTABLE_CLASSES
    from ._scoring import score_execution

    if failure is not None and failure not in REPORTABLE_CLASSES:
        raise typer.BadParameter(f"--failure must be one of {', '.join(sorted(REPORTABLE_CLASSES))}")
    fin = score_execution(
        execution_id,
        evaluator_from_env(),
        task,
        workspace,
        timed_out=timed_out,
        exit_code=exit_code,
        failure=failure,  # type: ignore[arg-type]  # checked against REPORTABLE_CLASSES above
    )
    console.print(
        f"{execution_id}: {fin.status} score={fin.score} failure={fin.failure_class or '-'} {fin.detail[:200]}"
    )
    if dry_run:
        return

    async def record() -> int:
        async with log_session(settings_from(data_dir, nats_url)) as log:
            return (await log.append(fin)).seq

    console.print(f"recorded at seq {asyncio.run(record())}")


@train_app.command("preview")
def preview_command(
    execution_id: Annotated[str, typer.Argument()],
    max_paths: Annotated[int, typer.Option(help="Jmax (0 = all paths)")] = 5,
    seed: Annotated[int, typer.Option()] = 0,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Show the bounded sample of one execution: drawn paths, targets, and the cost against all paths."""
    from opengyre.eventlog import PayloadFetch
    from opengyre.trajectory import TrajectoryError

    from ._cost import sample_cost
    from ._sampling import PathSampler
    from ._store import TrainerStore

    settings = settings_from(data_dir, nats_url, db_url)
    store = TrainerStore(_engine(settings.store_url("trainer")))
    payloads = None
    if store.payload_keys([execution_id]):  # tokens stored by reference: read them from the event log

        async def fetch() -> PayloadFetch:
            async with log_session(settings) as log:
                return await store.fetch_payloads(log, [execution_id])

        payloads = asyncio.run(fetch())
    try:
        tree = store.tree(execution_id, payloads)
    except TrajectoryError as exc:
        raise fail(str(exc)) from exc
    drawn = PathSampler(max_paths or None).sample(tree, random.Random(seed))
    t = Table("order", "leaf", "role", "tokens", "targets", "draw weight")
    for d in drawn:
        t.add_row(str(d.order), d.path.leaf, d.path.role, str(len(d.path.tokens)), str(d.n_targets), str(d.draw_weight))
    console.print(t)
    c = sample_cost(tree, drawn)
    console.print(
        f"{c.paths}/{c.leaves} paths; targets {c.target_tokens}/{c.generated_tokens} generated tokens; "
        f"forward tokens {c.forward_tokens} vs {c.all_paths_forward_tokens} for all paths"
    )


@train_app.command("steps")
def steps_command(
    run_id: Annotated[str, typer.Option()] = "default", data_dir: DataDirOpt = None, db_url: DbUrlOpt = None
) -> None:
    """Training steps of a run as the trainer projection records them."""
    from ._store import TrainerStore

    rows = TrainerStore(_engine(settings_from(data_dir, None, db_url).store_url("trainer"))).steps(run_id)
    t = Table("step", "version", "loss", "trained", "dropped", "tokens", "reward", "grad norm", "staleness")
    for r in rows:
        reward = "-" if r["reward_mean"] is None else f"{r['reward_mean']:.3f}"
        norm = "-" if r["grad_norm"] is None else f"{r['grad_norm']:.3f}"
        stale = f"{r['staleness_mean']:.2f}/{r['staleness_max']}"
        t.add_row(
            str(r["step"]), str(r["weight_version"]), f"{r['loss']:.4f}", str(r["n_trained"]), str(r["n_dropped"]),
            str(r["n_tokens"]), reward, norm, stale,
        )  # fmt: skip
    console.print(t)
