"""The `opengyre` command line: the stack, the event log, projections, and each service's commands."""

from __future__ import annotations

from importlib.metadata import entry_points

import typer

from . import _db, _demo, _events, _loop, _model, _replay, _report, _stack

__all__ = ["app", "main"]

app = typer.Typer(
    help="OpenGyre: open infrastructure for training long-horizon LLM agents with online RL.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
)
events_app = typer.Typer(help="Read the event log.", no_args_is_help=True)
projections_app = typer.Typer(help="List and rebuild projections.", no_args_is_help=True)
service_app = typer.Typer(help="Run one service in the foreground.", no_args_is_help=True)
db_app = typer.Typer(help="The projection store.", no_args_is_help=True)
app.add_typer(events_app, name="events")
app.add_typer(projections_app, name="projections")
app.add_typer(service_app, name="service")
app.add_typer(db_app, name="db")

_stack.register(app, service_app)
_events.register(events_app)
_replay.register(app, projections_app)
_demo.register(app)
_db.register(db_app)
_model.register(app)
_report.register(app)

# Each service (and a shared package) may add commands (`opengyre engine`, `opengyre sim`, ...) through an
# ``opengyre.commands`` entry point naming its ``register(app)``; heavy imports belong inside the commands.
for _ep in sorted(entry_points(group="opengyre.commands"), key=lambda e: e.name):
    _ep.load()(app)
_loop.register(app)  # after the services': `train loop|env` join the trainer's `train` group


def main() -> None:
    app()
