"""``opengyre harness run`` (the reference agent) and ``opengyre harness launch`` (any spec, in the sandbox)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer

__all__ = ["EXIT_CODES", "harness_app", "register", "run"]

# The agent's exit status by finish reason (the JSON summary says the same, with a message).
EXIT_CODES = {"submitted": 0, "max-turns": 3, "timeout": 4, "model-error": 5}

harness_app = typer.Typer(
    help="The reference agent harness, and running any harness in a sandbox.", no_args_is_help=True
)


@harness_app.command("run")
def run(
    base_url: Annotated[str, typer.Option(envvar="OPENAI_BASE_URL", help="the execution's base URL (.../x/<id>/v1)")],
    api_key: Annotated[str, typer.Option(envvar="OPENAI_API_KEY", help="the execution's key")],
    model: Annotated[str, typer.Option(help="the model name to ask for")],
    task: Annotated[str | None, typer.Option(help="the task's instruction")] = None,
    task_file: Annotated[Path | None, typer.Option(help="a file holding the instruction")] = None,
    workdir: Annotated[Path, typer.Option(help="the workspace")] = Path("."),
    summary_file: Annotated[Path | None, typer.Option(help="also write the JSON summary here")] = None,
    max_turns: Annotated[int, typer.Option(min=1)] = 50,
    sub_agent_max_turns: Annotated[int, typer.Option(min=1)] = 20,
    time_limit: Annotated[float | None, typer.Option(help="seconds for the whole episode")] = None,
    command_timeout: Annotated[float, typer.Option(help="seconds per shell command")] = 60.0,
    max_output_chars: Annotated[int, typer.Option(min=1, help="a tool result is cut to this")] = 16_000,
    context_budget: Annotated[int, typer.Option(min=1, help="tokens; past it the context is compacted")] = 8_000,
    max_tokens: Annotated[int | None, typer.Option(min=1, help="per model call")] = None,
    temperature: Annotated[float | None, typer.Option()] = None,
    max_retries: Annotated[int, typer.Option(min=0, help="the SDK's retries per call")] = 2,
    sub_agents: Annotated[bool, typer.Option(help="offer the spawn_agent tool")] = True,
    command_network: Annotated[bool, typer.Option(help="let shell commands use the network")] = False,
) -> None:
    """Solve one task through an OpenAI-compatible endpoint; prints a JSON summary; exit 0 = submitted."""
    from ._agent import AgentConfig, run_agent

    if (task is None) == (task_file is None):
        raise typer.BadParameter("give exactly one of --task and --task-file")
    instruction = task if task is not None else Path(task_file).read_text()  # type: ignore[arg-type]
    try:
        config = AgentConfig(
            base_url=base_url,
            api_key=api_key,
            model=model,
            workdir=workdir,
            max_turns=max_turns,
            sub_agent_max_turns=sub_agent_max_turns,
            time_limit_s=time_limit,
            command_timeout_s=command_timeout,
            max_output_chars=max_output_chars,
            context_budget_tokens=context_budget,
            max_tokens=max_tokens,
            temperature=temperature,
            max_retries=max_retries,
            sub_agents=sub_agents,
            command_network=command_network,
        )
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    summary = run_agent(config, instruction)
    text = summary.to_json()
    if summary_file is not None:
        summary_file.write_text(text + "\n")
    typer.echo(text)
    if summary.finish_reason != "submitted":
        typer.echo(f"harness: {summary.finish_reason}: {summary.message}", err=True)
    raise typer.Exit(EXIT_CODES[summary.finish_reason or "model-error"])


@harness_app.command("launch")
def launch(
    base_url: Annotated[str, typer.Option(help="the execution's base URL (.../x/<id>/v1)")],
    api_key: Annotated[str, typer.Option(envvar="OPENGYRE_HARNESS_KEY", help="the execution's key")],
    model: Annotated[str, typer.Option()],
    task_file: Annotated[Path, typer.Option(exists=True, dir_okay=False, help="the task's instruction")],
    workdir: Annotated[Path, typer.Option(exists=True, file_okay=False, help="the workspace")],
    spec: Annotated[Path | None, typer.Option(help="a harness spec (TOML: name, argv, env); default: built-in")] = None,
    timeout: Annotated[float, typer.Option(help="seconds before the sandbox kills the harness")] = 1800.0,
    sandbox: Annotated[
        str | None,
        typer.Option(help="the sandbox backend (namespace, none, ...); default: $OPENGYRE_SANDBOX or namespace"),
    ] = None,
    context_length: Annotated[
        int | None,
        typer.Option(min=1, help="the context the proxy serves, in tokens ({context_length} in a spec needs it)"),
    ] = None,
) -> None:
    """Run a harness in the task's sandbox against one execution; prints the outcome as JSON; exit 0 when it
    submitted (or, without a summary, exited 0)."""
    from opengyre.sandbox import SandboxError, SandboxLimits

    from ._launch import HarnessTarget, run_harness
    from ._spec import HarnessSpec, builtin_spec

    try:
        harness = HarnessSpec.from_toml(spec) if spec is not None else builtin_spec()
        limits = SandboxLimits(timeout_s=timeout, memory_mb=8192)  # the proxy is its way out: the sandbox's egress
        limits.validate()
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    target = HarnessTarget(base_url, api_key, model, workdir, task_file.read_text(), context_length)
    try:
        out = run_harness(harness, target, limits, backend=sandbox)
    except SandboxError as exc:  # the sandbox could not run it: an infrastructure failure, not a bad option
        typer.echo(f"harness launch: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        json.dumps(
            {"exit_code": out.exit_code, "finish_reason": out.finish_reason, "summary": out.summary}, sort_keys=True
        )
    )
    sys.stderr.write(out.stderr[-4000:])
    raise typer.Exit(0 if out.finish_reason in ("submitted", "exited") else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(harness_app, name="harness")
