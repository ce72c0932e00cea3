"""Commands svc-synth adds to ``opengyre``: ``opengyre synth patterns|ingest|build|validate|import|lineage`` on
folders here (no stack needed), and ``list|export|harden`` against the running synth service over gRPC.

``ingest``, ``build``, ``validate`` and ``import`` work in-process; a running stack's synth service does the same
over gRPC (``SynthService``) and records the events. ``lineage`` reads the service's task catalogue, or, without
one, the task store's blueprints. Everything a skill or a task brings (names, reasons) is printed escaped: Rich
must not read ``[task]`` in an error as markup and swallow it.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opengyre.console import DataDirOpt, DbUrlOpt, console, fail, settings_from

__all__ = ["register"]

synth_app = typer.Typer(
    help="Skill2Env: skills into validated Harbor tasks with tunable difficulty.", no_args_is_help=True
)
T = TypeVar("T")
AddrOpt = Annotated[str | None, typer.Option("--addr", help="host:port [default: the stack's synth service]")]


def register(app: typer.Typer) -> None:
    app.add_typer(synth_app, name="synth")


def _call(addr: str | None, data_dir: Path | None, fn: Callable[[Any], Awaitable[T]]) -> T:
    """One call to the synth service over gRPC (the stack's, or ``--addr``); its error code and details, else."""
    import grpc

    from opengyre.runtime import grpc_channel
    from opengyre.v1 import synth_pb2_grpc

    settings = settings_from(data_dir)
    target = addr or f"{settings.host}:{settings.ports['synth']}"

    async def go() -> T:
        async with grpc_channel(target, settings.grpc_token()) as ch:
            return await fn(synth_pb2_grpc.SynthServiceStub(ch))

    try:
        return asyncio.run(go())
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise fail(f"no synth service at {target}: is the stack up? (`opengyre up`) ({exc.details()})") from exc
        raise fail(f"{exc.code().name}: {exc.details()}") from exc


def _said(exc: Exception) -> str:
    # A KeyError's str() is its message quoted: the message itself.
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


@synth_app.command("patterns")
def patterns_command() -> None:
    """The difficulty-pattern pool: dimension, knobs and their levels (fits 80 columns)."""
    from opengyre.synth import DIMENSIONS, get_pattern, pattern_ids

    for dim in DIMENSIONS:
        console.print(f"[bold]{dim}[/]")
        for pid in pattern_ids(dim):
            p = get_pattern(pid)
            knobs = "; ".join(f"{k} {','.join(map(str, v))}" for k, v in p.knobs.items())
            console.print(f"  [cyan]{pid}[/]  {escape(knobs)}", width=80, overflow="fold")
            for line in textwrap.wrap(p.summary, 74):
                console.print(f"    [dim]{escape(line)}[/]", width=80)


@synth_app.command("ingest")
def ingest_command(
    source: Annotated[Path, typer.Argument(help="A skills folder, .zip or .tar.gz")],
    out: Annotated[Path, typer.Option(help="Where archives are extracted")] = Path("synth-skills"),
) -> None:
    """Read skills and show each verdict: accepted with its capability requirements, or rejected with why."""
    from opengyre.synth import ingest

    if not source.exists():
        raise fail(f"no skill folder or archive at {source}")
    report = ingest(source, out)
    t = Table("skill", "verdict", "capabilities / reason")
    for s in report.accepted:
        t.add_row(escape(s.name), "[green]accepted", " ".join(f"{k}={v:g}" for k, v in s.capabilities.items()))
    for r in report.rejected:
        t.add_row(escape(r.name), "[red]rejected", escape(r.reason))
    console.print(t)
    if not report.accepted:
        raise typer.Exit(1)


@synth_app.command("build")
def build_command(
    source: Annotated[Path, typer.Argument(help="A skills folder, .zip or .tar.gz")],
    out: Annotated[Path, typer.Option(help="Task store (Harbor task directories under tasks/)")] = Path("synth-store"),
    tasks_per_skill: Annotated[int, typer.Option(min=1, max=1000)] = 1,
    challenges: Annotated[int, typer.Option(min=1, max=8)] = 2,
    level: Annotated[int, typer.Option(min=0, max=3)] = 0,
    seed: int = 0,
    workers: Annotated[int, typer.Option(min=1, max=64)] = 4,
    pattern: Annotated[
        list[str] | None, typer.Option("--pattern", help="Use this pattern (repeat for more; see `synth patterns`)")
    ] = None,
    knob: Annotated[
        list[str] | None, typer.Option("--knob", help="KNOB=LEVEL or PATTERN.KNOB=LEVEL (repeatable)")
    ] = None,
) -> None:
    """Synthesize tasks from every accepted skill (procedural mode) and run every gate, with a progress bar."""
    from opengyre.synth import Synthesizer, check_choice, parse_knobs

    try:
        knobs = parse_knobs(knob or [])
        check_choice(pattern or [], knobs)
    except ValueError as exc:
        raise fail(_said(exc)) from exc
    synth = Synthesizer(out, workers=workers)
    report, _ = synth.ingest(source)
    if not report.accepted:
        raise fail(f"no accepted skill in {source}")
    jobs = [(s, seed + i) for s in report.accepted for i in range(tasks_per_skill)]
    try:
        with Progress(
            TextColumn("building + validating"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as bar:
            task = bar.add_task("tasks", total=len(jobs))
            builds = synth.synthesize_many(
                jobs,
                n_challenges=len(pattern) if pattern else challenges,
                level=level,
                patterns=pattern or None,
                knobs=knobs,
                progress=lambda: bar.advance(task),
            )
    except (ValueError, KeyError, FileExistsError) as exc:
        raise fail(_said(exc)) from exc
    t = Table("task", "patterns", "gates", "directory")
    for b in builds:
        failed = "; ".join(f"{v.gate}: {v.reason}" for v in b.verdicts if not v.ok)
        gates = "[green]all pass" if b.ok else "[red]" + escape(failed)
        t.add_row(b.blueprint.task_id, ", ".join(c.pattern_id for c in b.blueprint.challenges), gates, str(b.task_dir))
    console.print(t)
    console.print(f"{sum(b.ok for b in builds)}/{len(builds)} validated")
    if not all(b.ok for b in builds):
        raise typer.Exit(1)


@synth_app.command("validate")
def validate_command(task_dir: Annotated[Path, typer.Argument(help="A task directory built by svc-synth")]) -> None:
    """Run every gate on a task directory and show the verdicts."""
    from opengyre.synth import validate_task

    if not (task_dir / "tests" / "blueprint.json").is_file():
        raise fail(f"{task_dir} has no tests/blueprint.json: not a task svc-synth built")
    verdicts = validate_task(task_dir)
    t = Table("gate", "verdict", "reason")
    for v in verdicts:
        t.add_row(v.gate, "[green]ok" if v.ok else "[red]fail", escape(v.reason))
    console.print(t)
    if not all(v.ok for v in verdicts):
        raise typer.Exit(1)


@synth_app.command("import")
def import_command(
    source: Annotated[Path, typer.Argument(help="A Harbor task directory")],
    dest: Annotated[Path | None, typer.Argument(help="Copy it here")] = None,
) -> None:
    """Check a Harbor task directory (from anywhere) and optionally copy it in."""
    from opengyre.synth import import_task

    try:
        t = import_task(source, dest)
    except (ValueError, FileExistsError) as exc:
        raise fail(str(exc)) from exc
    console.print(
        escape(
            f"{t.name} -> task {t.task_id} v{t.version} at {t.path}"
            f" ({'with' if t.has_solution else 'without'} a reference solution"
            + (f", {len(t.steps)} steps: {', '.join(t.steps)}" if t.steps else "")
            + ")"
        )
    )
    if t.container_needs:  # a valid Harbor task, but the host sandbox would run it wrongly: it refuses to
        console.print("[yellow]needs its container; the host sandbox refuses to run it:[/]")
        for need in t.container_needs:
            console.print(f"  - {escape(need)}")


@synth_app.command("list")
def list_command(addr: AddrOpt = None, data_dir: DataDirOpt = None) -> None:
    """The running service's task catalogue: current version, validation, too-easy and hardened counts (gRPC)."""
    from opengyre.v1 import synth_pb2 as pb

    reply = _call(addr, data_dir, lambda stub: stub.ListTasks(pb.ListTasksRequest()))
    t = Table("task", "skill", "version", "validated", "too easy", "hardened")
    for x in reply.tasks:
        t.add_row(
            x.task_id, x.skill_id, str(x.version), x.validated or "-", str(x.too_easy_count), str(x.hardened_count)
        )
    console.print(t)
    console.print(f"{len(reply.tasks)} task(s)")


@synth_app.command("export")
def export_command(
    task_id: str,
    dest: Annotated[Path, typer.Argument(help="A new folder on the service's machine")],
    version: Annotated[int, typer.Option(min=0, help="The version (0: the current one)")] = 0,
    addr: AddrOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Copy a task version's Harbor directory out of the running service's store (gRPC)."""
    from opengyre.v1 import synth_pb2 as pb

    req = pb.ExportTaskRequest(task_id=task_id, version=version, dest=str(dest.absolute()))
    reply = _call(addr, data_dir, lambda stub: stub.ExportTask(req))
    console.print(escape(f"{task_id} -> {reply.path}"))


@synth_app.command("harden")
def harden_command(addr: AddrOpt = None, data_dir: DataDirOpt = None) -> None:
    """Harden every version the service found too easy, now, and show what changed (gRPC)."""
    from opengyre.v1 import synth_pb2 as pb

    reply = _call(addr, data_dir, lambda stub: stub.HardenTasks(pb.HardenTasksRequest()))
    t = Table("task", "from", "to", "bypassed", "why")
    for h in reply.hardened:
        t.add_row(h.task_id, str(h.from_version), str(h.to_version), h.bypassed, escape(h.reason))
    console.print(t)
    console.print(f"{len(reply.hardened)} task(s) hardened")


def _catalogue_lineage(url: str, task_id: str) -> list[tuple[str, str, str, str, str]] | None:
    """Rows from the service's catalogue; None when there is none (no database yet, or not the synth tables)."""
    from sqlalchemy.exc import SQLAlchemyError

    from opengyre.store import create_db_engine
    from opengyre.synth import task_lineage

    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).is_file():
        return None  # connecting would create an empty file, or fail with a raw sqlite error
    engine = create_db_engine(url)
    try:
        with engine.connect() as conn:
            versions = task_lineage(conn, task_id)
    except SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    return [
        (
            str(v.version),
            str(v.parent_version or "-"),
            ", ".join(f"{p['pattern_id']}{p['knobs']}" for p in json.loads(v.patterns)),
            str(v.validated),
            v.reason,
        )
        for v in versions
    ]


@synth_app.command("lineage")
def lineage_command(
    task_id: str,
    data_dir: DataDirOpt = None,
    db_url: DbUrlOpt = None,
    store: Annotated[
        Path | None,
        typer.Option(help="This task store's blueprints [default: the catalogue, else <data-dir>/synth]"),
    ] = None,
) -> None:
    """Every version of a task with its parent, patterns and gate verdicts: from the synth service's catalogue, or,
    without one (no stack yet, or ``--store``), from the blueprints in the task store."""
    from opengyre.synth import Synthesizer

    settings = settings_from(data_dir, db_url=db_url)
    rows = None if store is not None else _catalogue_lineage(settings.store_url("synth"), task_id)
    where = "the catalogue"
    if not rows:
        where = str(store or settings.data_dir / "synth")
        rows = [
            (
                str(bp.version),
                str(bp.parent_version or "-"),
                ", ".join(f"{c.pattern_id}{c.knobs}" for c in bp.challenges),
                "-",
                "from the store's blueprint (no catalogue)",
            )
            for bp in Synthesizer(Path(where)).versions(task_id)
        ]
    if not rows:
        raise fail(f"no task {task_id} in the catalogue nor in the task store {where}")
    t = Table("version", "parent", "patterns", "validated", "why", title=f"{escape(task_id)} ({escape(where)})")
    for r in rows:
        t.add_row(*map(escape, r))
    console.print(t)
