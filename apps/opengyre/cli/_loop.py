"""``opengyre train loop|env``: the closed loop's commands, beside the trainer's own ``opengyre train ...``.

They drive the loop (``opengyre.loop``, an app over every service), so they live in the apps layer, not in the
trainer's CLI (issue 25: a service never imports an app); they join the trainer's ``train`` group when it has one.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from opengyre.console import DataDirOpt, console, fail, settings_from

__all__ = ["register"]

_train = typer.Typer(help="Train the policy: online RL from the log, SFT warm starts, scoring.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add ``loop`` and ``env`` to the ``train`` group a service registered (the trainer's), else a group of its own."""
    group = next((g.typer_instance for g in app.registered_groups if g.name == "train"), None)
    if group is None:
        app.add_typer(_train, name="train")
    else:
        group.registered_commands.extend(_train.registered_commands)


@_train.command("loop")
def loop_command(
    config: Annotated[Path, typer.Argument(help="The run configuration (TOML; see docs/loop.md)")],
    data_dir: DataDirOpt = None,
    attach: Annotated[
        bool,
        typer.Option(
            "--attach",
            help="Drive the run on the deployment already running on the data dir (opengyre up, started with "
            "the settings `opengyre train env RUN.toml` prints) instead of starting a stack",
        ),
    ] = False,
) -> None:
    """The closed loop on the embedded stack: synthesize tasks, dispatch groups, roll out, score, train, harden."""
    from opengyre.loop import DeploymentMismatch, RunConfig, RunConfigError, run_loop, sft_warm_start
    from opengyre.runtime import DataDirBusy, DataDirUnusable, PortTaken, ServiceFailed

    try:
        cfg = RunConfig.from_toml(config).check()  # before any service starts
    except RunConfigError as exc:
        raise fail(str(exc)) from exc
    settings = settings_from(data_dir)
    if attach and cfg.sft_epochs:
        raise fail(
            "sft_epochs: a warm start needs the embedded stack (the running trainer starts from its own "
            "weights); set it to 0 with --attach"
        )
    warm = (
        sft_warm_start(
            cfg.model,
            epochs=cfg.sft_epochs,
            lr=cfg.sft_lr,
            seed=cfg.seed,
            say=console.print,
            cache=settings.data_dir / "cache" / "warm-start",
        )
        if cfg.sft_epochs
        else None
    )  # the run configuration's warm start: SFT on the built tasks' reference solutions first
    try:
        result = asyncio.run(run_loop(cfg, settings, say=console.print, warm_start=warm, attach=attach))
    except (DataDirBusy, DataDirUnusable, PortTaken, DeploymentMismatch) as exc:
        raise fail(str(exc)) from exc
    except ServiceFailed as exc:  # a service kept exiting with the same error: the run cannot go on
        raise fail(str(exc), 1) from exc
    ended = sum(1 for f in result.finished if f.score is not None)
    console.print(
        f"{len(result.finished)} executions ({ended} scored), {len(result.steps)} step(s) trained, "
        f"{result.hardened} task version(s) hardened; " + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items())
    )


@_train.command("env")
def env_command(
    config: Annotated[Path, typer.Argument(help="The run configuration (TOML; see docs/loop.md)")],
    data_dir: DataDirOpt = None,
) -> None:
    """Prepare a deployment for `train loop --attach`: write the run's trainer.toml into the data dir and print the
    environment its services must start with: eval "$(opengyre train env RUN.toml --data-dir D)", then opengyre up."""
    import shlex

    from opengyre.loop import RunConfig, RunConfigError, deployment_env, write_trainer_toml

    try:
        cfg = RunConfig.from_toml(config)
        cfg.validate()
    except RunConfigError as exc:
        raise fail(str(exc)) from exc
    settings = settings_from(data_dir)
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    # No engine list: the trainer reloads the engines of the rollout cells the driver registers (from their events).
    path = write_trainer_toml(cfg, settings, [], None)
    typer.echo(f"# wrote {path}", err=True)
    for k, v in sorted(deployment_env(cfg).items()):
        typer.echo(f"export {k}={shlex.quote(v)}")
