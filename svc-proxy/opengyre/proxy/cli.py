"""Commands the proxy adds to ``opengyre``: ``engine`` (the CPU engine) and ``proxy key`` (execution access)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .engine._cli import engine_command

__all__ = ["register"]

proxy_app = typer.Typer(help="The model gateway: execution keys.", no_args_is_help=True)


@proxy_app.command("key")
def key_command(
    execution_id: Annotated[str, typer.Argument(help="the execution the key is for")],
    role: Annotated[str, typer.Option(help="main | main-summary | sub-agent | sub-agent-summary")] = "main",
    data_dir: Annotated[Path, typer.Option(envvar="OPENGYRE_DATA_DIR", help="where proxy.secret lives")] = Path(
        ".opengyre"
    ),
) -> None:
    """Print the base URLs and API key a harness needs for one execution (JSON)."""
    from ._keys import ROLES, ExecutionKeys, load_or_create_secret

    if role not in ROLES:
        raise typer.BadParameter(f"role must be one of {', '.join(ROLES)}")
    keys = ExecutionKeys(load_or_create_secret(data_dir / "proxy.secret"))
    try:
        key = keys.issue(execution_id, role)  # type: ignore[arg-type]
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    url_file = data_dir / "proxy.url"
    url = url_file.read_text().strip() if url_file.exists() else "http://127.0.0.1:8080"
    out = {
        "execution_id": execution_id,
        "role": role,
        "base_url": f"{url}/x/{execution_id}/v1",
        "anthropic_base_url": f"{url}/x/{execution_id}",
        "api_key": key,
    }
    typer.echo(json.dumps(out, indent=2))


def register(app: typer.Typer) -> None:
    app.command("engine")(engine_command)
    app.add_typer(proxy_app, name="proxy")
