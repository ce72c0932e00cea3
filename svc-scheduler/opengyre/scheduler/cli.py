"""``opengyre sim`` (the discrete-event simulator) and ``opengyre scheduler`` (the live service over gRPC)."""

from __future__ import annotations

import typer

from ._cli_scheduler import scheduler_app
from ._cli_sim import sim_app

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.add_typer(sim_app, name="sim")
    app.add_typer(scheduler_app, name="scheduler")
