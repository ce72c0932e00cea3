"""``opengyre sandbox check``: probe every sandbox backend on this machine and say what isolation each gives."""

from __future__ import annotations

from typing import Annotated

import typer

__all__ = ["register", "sandbox_app"]

sandbox_app = typer.Typer(help="The sandboxes that run model-written commands.", no_args_is_help=True)


@sandbox_app.command("check")
def check(
    backend: Annotated[list[str] | None, typer.Option(help="only these backends (repeatable); default: all")] = None,
) -> None:
    """Run probe commands in each backend and print what it isolates; exit 0 when the selected backend
    ($OPENGYRE_SANDBOX, else namespace) works, 1 when it does not."""
    from ._backend import backend_names, get_backend, selected_backend

    try:
        selected = selected_backend()
    except RuntimeError as exc:  # an unknown $OPENGYRE_SANDBOX
        typer.echo(f"sandbox: {exc}", err=True)
        raise typer.Exit(1) from exc
    names = backend or backend_names()
    unknown = sorted(set(names) - set(backend_names()))
    if unknown:
        raise typer.BadParameter(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(backend_names())}")
    results = {}
    for name in names:
        ok, lines = get_backend(name).check()
        results[name] = ok
        mark = "ok" if ok else "UNAVAILABLE"
        typer.echo(f"{name}{' (selected)' if name == selected else ''}: {mark}")
        for line in lines:
            typer.echo(f"  {line}")
    if selected in results:
        raise typer.Exit(0 if results[selected] else 1)
    raise typer.Exit(0 if all(results.values()) else 1)


def register(app: typer.Typer) -> None:
    app.add_typer(sandbox_app, name="sandbox")
