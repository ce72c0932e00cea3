"""``python -m opengyre.engine``: the CPU engine without the rest of the CLI."""

import typer

from ._cli import engine_command

if __name__ == "__main__":
    typer.run(engine_command)
