"""Commands the proxy adds to ``opengyre``: ``engine`` (the CPU engine) and ``proxy key`` (execution access)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from opengyre.console import DataDirOpt, DbUrlOpt, NatsUrlOpt, fail, log_session, settings_from
from opengyre.engine import engine_command

if TYPE_CHECKING:
    from opengyre.config import Settings

    from .recording._trees import StoredCall

__all__ = ["register"]

proxy_app = typer.Typer(help="The model gateway: execution keys, trajectory trees, ATIF.", no_args_is_help=True)


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
    secret = data_dir / "proxy.secret"
    if not secret.is_file():  # a new secret here would sign keys no running proxy accepts
        raise fail(
            f"no proxy.secret in {data_dir.resolve()}: pass the running stack's --data-dir (or OPENGYRE_DATA_DIR)"
        )
    keys = ExecutionKeys(load_or_create_secret(secret))  # it exists: read, not created
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


def _stored_calls(settings: Settings, execution_id: str) -> list[StoredCall]:
    """An execution's recorded calls from the store (tokens still by reference); a clear error when it has none."""
    from opengyre.store import create_db_engine

    from .recording._trees import load_calls

    engine = create_db_engine(settings.store_url("proxy"))
    try:
        with engine.connect() as conn:
            calls = load_calls(conn, execution_id)
    finally:
        engine.dispose()
    if not calls:
        raise fail(f"no recorded calls for execution {execution_id!r}")
    return calls


@proxy_app.command("tree")
def tree_command(
    execution_id: Annotated[str, typer.Argument(help="the execution to show")],
    data_dir: DataDirOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Print an execution's trajectory tree from the store (one line per call, indented by depth)."""
    calls = _stored_calls(settings_from(data_dir, None, db_url), execution_id)
    parents = {c.event.parent_call_id for c in calls}
    leaves = {c.event.call_id for c in calls if c.event.call_id not in parents}
    depth: dict[str, int] = {}
    for c in calls:
        e = c.event
        depth[e.call_id] = depth[e.parent_call_id] + 1 if e.parent_call_id else 0
        mark = "leaf" if e.call_id in leaves else ""
        drift = f" drift@{e.drift.position}" if e.drift else ""
        typer.echo(
            f"{'  ' * depth[e.call_id]}{e.call_id[:12]} {e.role:<17} {e.branch:<9} prefix={e.prefix_len} "
            f"+{e.n_prompt_delta} out={e.n_output} {e.finish_reason} w={e.weight_version} "
            f"engine={e.engine_id}{drift} {mark}".rstrip()
        )


@proxy_app.command("atif")
def atif_command(
    execution_id: Annotated[str, typer.Argument(help="the execution to export")],
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Print an execution as ATIF JSON (token payloads and out-of-band contexts are read from the event log)."""
    import asyncio

    from opengyre.trajectory import PayloadUnavailable, TrajectoryTree

    from ._grpc import resolve_contexts
    from .recording._atif import export_execution
    from .recording._trees import resolve_stored

    settings = settings_from(data_dir, nats_url, db_url)
    stored = _stored_calls(settings, execution_id)

    async def fetch() -> tuple[list[StoredCall], dict[str, dict[str, object]]]:
        async with log_session(settings) as log:
            calls = await resolve_stored(log, stored)
            return calls, await resolve_contexts(log, calls)

    calls: list[StoredCall] = stored  # inline calls (older logs) need no event log
    contexts: dict[str, dict[str, object]] = {}
    if any(c.event.payload is not None or c.event.context_ref for c in stored):
        try:
            calls, contexts = asyncio.run(fetch())
        except PayloadUnavailable as exc:
            raise fail(f"cannot export {execution_id}: {exc}") from exc
    tree = TrajectoryTree(execution_id, [c.event for c in calls])
    typer.echo(json.dumps(export_execution(tree, calls, contexts=contexts), indent=2))


def register(app: typer.Typer) -> None:
    app.command("engine")(engine_command)
    app.add_typer(proxy_app, name="proxy")
