"""``python -m opengyre.harness --base-url ... --model ... --task ...``: the reference agent alone (what the
built-in ``HarnessSpec`` runs in the sandbox), without the rest of the ``opengyre`` command line."""

import typer

from .cli import run

app = typer.Typer(add_completion=False)
app.command()(run)

if __name__ == "__main__":
    app()
