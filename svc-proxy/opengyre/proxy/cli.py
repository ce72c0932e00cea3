"""Commands the proxy adds to ``opengyre``: ``engine`` (the CPU engine) and ``proxy key`` (execution keys)."""

from __future__ import annotations

import typer

from .engine._cli import engine_command

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("engine")(engine_command)
