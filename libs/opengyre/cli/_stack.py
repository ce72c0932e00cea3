"""`opengyre up`, `down`, `status` and the internal `service run`."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from typing import Annotated

import grpc
import typer
from rich.markup import escape
from rich.table import Table

from ..config import Settings
from ..eventlog import LogUnavailable
from ..runtime import (
    SERVICE_CLASSES,
    Stack,
    StackAlreadyRunning,
    load_service,
    read_stack_file,
    run_service,
    stack_alive,
)
from ._common import DataDirOpt, DbUrlOpt, NatsUrlOpt, console, fail, settings_from

__all__ = ["register"]


def _install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _up(settings: Settings, services: list[str]) -> None:
    stack = Stack(settings, services)
    stop = asyncio.Event()
    _install_stop_signals(stop)
    await stack.start()
    _print_stack(stack)
    console.print("[dim]Ctrl-C stops the stack; `opengyre up` again on this data dir resumes it.[/]")
    try:
        await stack.supervise(stop)
    finally:
        console.print("stopping services ...")
        await stack.stop()
        console.print("stopped.")


def _print_stack(stack: Stack) -> None:
    t = Table(title=f"OpenGyre on {stack.settings.data_dir}")
    t.add_column("component")
    t.add_column("address")
    t.add_column("pid", justify="right")
    t.add_row(
        "event log (NATS JetStream)",
        stack.nats_url,
        str(stack.nats.proc.pid if stack.nats and stack.nats.proc else "-"),
    )
    t.add_row("projection store", stack.settings.database_url, "-")
    for c in stack.children.values():
        t.add_row(f"svc-{c.name} (gRPC)", f"{stack.settings.host}:{c.port}", str(c.proc.pid if c.proc else "-"))
    console.print(t)


def _parse_services(value: str | None) -> list[str]:
    if not value:
        return list(SERVICE_CLASSES)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in SERVICE_CLASSES]
    if unknown:
        raise fail(f"unknown service(s) {', '.join(unknown)}; known: {', '.join(SERVICE_CLASSES)}")
    return names


def up(
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
    services: Annotated[str | None, typer.Option(help="Comma-separated subset of services to run")] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background; stop with `opengyre down`")
    ] = False,
) -> None:
    """Start the stack: the embedded nats-server (or join --nats-url), migrations, every service."""
    settings = settings_from(data_dir, nats_url, db_url)
    names = _parse_services(services)
    if detach:
        _detach(settings, names)
        return
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_up(settings, names))
    except (LogUnavailable, StackAlreadyRunning) as exc:
        raise fail(str(exc)) from exc


def _detach(settings: Settings, names: list[str]) -> None:
    running = stack_alive(settings)
    if running:
        raise fail(f"a stack already runs on {settings.data_dir} (pid {running['pid']}); stop it with `opengyre down`")
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable,
        "-m",
        "opengyre.cli",
        "up",
        "--data-dir",
        str(settings.data_dir),
        "--services",
        ",".join(names),
    ]
    if settings.nats_url:
        args += ["--nats-url", settings.nats_url]
    if settings.db_url:
        args += ["--db-url", settings.db_url]
    logf = (settings.data_dir / "up.log").open("ab")
    proc = subprocess.Popen(args, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        data = read_stack_file(settings)
        if data and int(data.get("pid", 0)) == proc.pid:
            console.print(f"stack up in the background (pid {proc.pid}); NATS at {data['nats_url']}")
            return
        if proc.poll() is not None:
            raise fail(f"the stack did not start; see {settings.data_dir / 'up.log'}")
        time.sleep(0.2)
    proc.terminate()
    raise fail("the stack did not come up within 120 s")


def down(data_dir: DataDirOpt = None) -> None:
    """Stop the stack started on this data dir."""
    settings = settings_from(data_dir)
    data = stack_alive(settings)
    if not data:
        console.print(f"no stack runs on {settings.data_dir}")
        return
    pid = int(data["pid"])
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if not stack_alive(settings):
            console.print(f"stack on {settings.data_dir} stopped")
            return
        time.sleep(0.2)
    raise fail(f"stack pid {pid} did not stop within 60 s")


async def _service_status(host: str, name: str, port: int) -> object:
    from ..v1 import common_pb2

    stub_mod = __import__(f"opengyre.v1.{name}_pb2_grpc", fromlist=["x"])
    stub_cls = getattr(stub_mod, f"{name.capitalize()}ServiceStub")
    async with grpc.aio.insecure_channel(f"{host}:{port}") as ch:
        return await stub_cls(ch).GetStatus(common_pb2.StatusRequest(), timeout=5)


def status(data_dir: DataDirOpt = None) -> None:
    """Show the running stack: services, what they do and do not do yet, projection lag."""
    settings = settings_from(data_dir)
    data = stack_alive(settings)
    if not data:
        raise fail(f"no stack runs on {settings.data_dir}: start one with `opengyre up`", code=1)

    async def collect() -> list[tuple[str, int, object]]:
        out = []
        for name, info in data["services"].items():
            try:
                out.append((name, info["port"], await _service_status(data["host"], name, info["port"])))
            except grpc.aio.AioRpcError as exc:
                out.append((name, info["port"], exc))
        return out

    rows = asyncio.run(collect())
    t = Table(title=f"stack on {settings.data_dir} (NATS {data['nats_url']})")
    for col in ("service", "port", "state", "projections (position / pending / dead)", "not implemented yet"):
        t.add_column(col)
    refusing: list[str] = []
    for name, port, st in rows:
        if isinstance(st, grpc.aio.AioRpcError):
            t.add_row(name, str(port), f"[red]{st.code().name}[/]", "", "")
            continue
        projs = ", ".join(
            f"{p.name} {p.position}/{p.pending}/{p.dead_letters}" + (" [red]REFUSES THE STREAM[/]" if p.error else "")
            for p in st.projections  # type: ignore[attr-defined]
        )
        refusing += [p.error for p in st.projections if p.error]  # type: ignore[attr-defined]
        t.add_row(name, str(port), "[green]serving[/]", projs or "-", ", ".join(st.not_implemented) or "-")  # type: ignore[attr-defined]
    console.print(t)
    for why in refusing:
        console.print(f"[bold red]error:[/] {escape(why)}")
    if refusing:
        raise typer.Exit(1)


def service_run(
    name: Annotated[str, typer.Argument(help="Service to run")],
    port: Annotated[int | None, typer.Option(help="gRPC port [default: the service's own]")] = None,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Run one service in the foreground (what `opengyre up` starts per service)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from(data_dir, nats_url, db_url)
    try:
        service = load_service(name)
    except KeyError as exc:
        raise fail(str(exc)) from exc

    async def main() -> None:
        stop = asyncio.Event()
        _install_stop_signals(stop)
        await run_service(service, settings, stop, port=port)

    try:
        asyncio.run(main())
    except LogUnavailable as exc:
        raise fail(str(exc)) from exc
    with contextlib.suppress(Exception):
        sys.stdout.flush()


def register(app: typer.Typer, service_app: typer.Typer) -> None:
    app.command()(up)
    app.command()(down)
    app.command()(status)
    service_app.command("run")(service_run)
