"""Commands svc-synth adds to ``opengyre``: ``opengyre synth patterns|ingest|build|validate|import|lineage``.

``ingest``, ``build``, ``validate`` and ``import`` work on folders here (no stack needed); a running stack's
synth service does the same over gRPC (``SynthService``) and records the events. ``lineage`` reads the
service's task catalogue.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from opengyre.console import DataDirOpt, DbUrlOpt, console, fail, settings_from

__all__ = ["register"]

synth_app = typer.Typer(
    help="Skill2Env: skills into validated Harbor tasks with tunable difficulty.", no_args_is_help=True
)


def register(app: typer.Typer) -> None:
    app.add_typer(synth_app, name="synth")


@synth_app.command("patterns")
def patterns_command() -> None:
    """The difficulty-pattern pool: dimension, knobs and their levels."""
    from opengyre.synth import get_pattern, pattern_ids

    t = Table("pattern", "dimension", "knobs (levels)", "what")
    for pid in pattern_ids():
        p = get_pattern(pid)
        t.add_row(pid, p.dimension, "; ".join(f"{k} {list(v)}" for k, v in p.knobs.items()), p.summary)
    console.print(t)


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
        t.add_row(s.name, "[green]accepted", " ".join(f"{k}={v:g}" for k, v in s.capabilities.items()))
    for r in report.rejected:
        t.add_row(r.name, "[red]rejected", r.reason)
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
) -> None:
    """Synthesize tasks from every accepted skill (procedural mode) and run every gate, with a progress bar."""
    from opengyre.synth import Synthesizer

    synth = Synthesizer(out, workers=workers)
    report, _ = synth.ingest(source)
    if not report.accepted:
        raise fail(f"no accepted skill in {source}")
    jobs = [(s, seed + i) for s in report.accepted for i in range(tasks_per_skill)]
    with Progress(
        TextColumn("building + validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
    ) as bar:
        task = bar.add_task("tasks", total=len(jobs))
        builds = synth.synthesize_many(jobs, n_challenges=challenges, level=level, progress=lambda: bar.advance(task))
    t = Table("task", "patterns", "gates", "directory")
    for b in builds:
        gates = (
            "[green]all pass" if b.ok else "[red]" + "; ".join(f"{v.gate}: {v.reason}" for v in b.verdicts if not v.ok)
        )
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
        t.add_row(v.gate, "[green]ok" if v.ok else "[red]fail", v.reason)
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
        f"{t.name} -> task {t.task_id} v{t.version} at {t.path}"
        f" ({'with' if t.has_solution else 'without'} a reference solution)"
    )


@synth_app.command("lineage")
def lineage_command(task_id: str, data_dir: DataDirOpt = None, db_url: DbUrlOpt = None) -> None:
    """Every version of a task with its parent, patterns and gate verdicts (from the synth service's store)."""
    from opengyre.store import create_db_engine
    from opengyre.synth import task_lineage

    settings = settings_from(data_dir, db_url=db_url)
    engine = create_db_engine(settings.store_url("synth"))
    try:
        with engine.connect() as conn:
            versions = task_lineage(conn, task_id)
    finally:
        engine.dispose()
    if not versions:
        raise fail(f"no task {task_id}")
    t = Table("version", "parent", "patterns", "validated", "why")
    for v in versions:
        pats = ", ".join(f"{p['pattern_id']}{p['knobs']}" for p in json.loads(v.patterns))
        t.add_row(str(v.version), str(v.parent_version or "-"), pats, str(v.validated), v.reason)
    console.print(t)
