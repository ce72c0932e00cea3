"""`opengyre up`, `down`, `status` and the internal `service run`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import grpc
import typer
from rich.markup import escape
from rich.table import Table
from sqlalchemy.engine import make_url

from opengyre.console import DataDirOpt, DbUrlOpt, NatsUrlOpt, StreamOpt, console, fail, settings_from

from ..config import HttpLimits, Settings, SettingsError
from ..eventlog import EventLog, LogUnavailable, NatsCredentials, StreamUsage
from ..runtime import (
    SERVICE_CLASSES,
    DataDirBusy,
    DataDirLock,
    DataDirUnusable,
    NatsServerMissing,
    PortTaken,
    Stack,
    check_data_dir,
    client_credentials,
    describe_holder,
    exit_after,
    exit_if_stop_hangs,
    find_leftovers,
    grpc_channel,
    is_service_of,
    load_service,
    lock_holder,
    nats_config_file,
    read_stack_file,
    reap_leftovers,
    run_service,
    stack_alive,
    stop_grace_s,
)

__all__ = ["register"]

# What `up` reports as a clear error rather than a traceback.
START_ERRORS = (LogUnavailable, DataDirBusy, DataDirUnusable, PortTaken, NatsServerMissing)


def _install_stop_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


async def _up(settings: Settings, services: list[str]) -> None:
    stack = Stack(settings, services)
    stop = asyncio.Event()
    _install_stop_signals(stop)
    await stack.start()
    if stack.reaped:
        console.print(_reaped_text([str(x) for x in stack.reaped]))
    _print_stack(stack)
    auth = settings.data_dir / "auth"
    nats = f"NATS users in {auth / 'nats'}" if stack.embedded else "NATS: the credentials of your --nats-url"
    console.print(f"[dim]gRPC requires the token in {auth / 'grpc.token'}; {nats} (docs/security.md)[/]")
    console.print(_exposure_text(settings.host))
    console.print(_http_limits_text(settings.http))
    console.print("[dim]Ctrl-C stops the stack; `opengyre up` again on this data dir resumes it.[/]")
    sys.stdout.flush()  # a detached stack's up.log shows it now, not at exit
    try:
        await stack.supervise(stop)
    finally:
        # up.log may be on a full disk: what it cannot say must not keep the services from being stopped.
        with contextlib.suppress(OSError):
            console.print("stopping services ...")
        await stack.stop()
        with contextlib.suppress(OSError):
            console.print("stopped.")


def _store_text(settings: Settings) -> str:
    if settings.db_url:
        return make_url(settings.db_url).render_as_string(hide_password=True)
    return f"SQLite, one file per service in {settings.data_dir / 'db'}"


def _print_stack(stack: Stack) -> None:
    t = Table(title=f"OpenGyre on {stack.settings.data_dir}")
    t.add_column("component")
    t.add_column("address")
    t.add_column("pid", justify="right")
    if stack.cluster is not None:
        replicas = stack.settings.log.replicas
        for server in stack.cluster.nodes:
            t.add_row(
                f"event log: NATS {server.store_dir.name} of {stack.cluster.size} (stream {stack.settings.log.stream}, "
                f"{replicas} replicas)",
                server.url,
                str(server.proc.pid if server.proc else "-"),
            )
    else:
        t.add_row(
            f"event log (NATS JetStream, stream {stack.settings.log.stream})",
            stack.nats_url,
            str(stack.nats.proc.pid if stack.nats and stack.nats.proc else "-"),
        )
    t.add_row("projection store", _store_text(stack.settings), "-")
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
    stream: StreamOpt = None,
    services: Annotated[str | None, typer.Option(help="Comma-separated subset of services to run")] = None,
    detach: Annotated[
        bool, typer.Option("--detach", "-d", help="Run in the background; stop with `opengyre down`")
    ] = False,
    engine: Annotated[
        list[str] | None,
        typer.Option(
            "--engine",
            help="A rollout engine the proxy routes to (repeat for several): http://host:port for SGLang or the "
            "CPU engine, vllm+http://host:port for vLLM [default: OPENGYRE_PROXY_ENGINES, else what was recorded]",
        ),
    ] = None,
    host: Annotated[
        str | None,
        typer.Option(
            help="Address the services' gRPC and the proxy's HTTP gateway listen on (0.0.0.0: every interface; "
            "gRPC still requires the stack's token) [default: OPENGYRE_HOST, else what was recorded, else 127.0.0.1]",
        ),
    ] = None,
    nats_cluster: Annotated[
        int | None,
        typer.Option(
            "--nats-cluster",
            help="Run the embedded log as a JetStream cluster of 3 or 5 nats-servers on loopback, the stream "
            "replicated 3 times (OPENGYRE_LOG_REPLICAS): it survives losing 1 (or 2) of them "
            "[default: OPENGYRE_NATS_CLUSTER, else one server]",
        ),
    ] = None,
) -> None:
    """Start the stack: the embedded nats-server (or join --nats-url), migrations, every service.

    One stack per data dir. The options are recorded in the data dir (settings.json): later commands, and the
    next `up`, use them without being told again.
    """
    try:  # settings_from's order (options, environment, recorded), with the cluster's size among the options
        settings = Settings.from_env(
            data_dir=data_dir, nats_url=nats_url, db_url=db_url, stream=stream, host=host, nats_cluster=nats_cluster
        )
    except SettingsError as exc:
        raise fail(str(exc)) from exc
    if settings.nats_cluster and settings.nats_url:
        raise fail("--nats-cluster runs the embedded log as a cluster, --nats-url joins one elsewhere: not both")
    if engine is not None:
        settings = dataclasses.replace(settings, proxy_engines=tuple(engine))
    names = _parse_services(services)
    if detach:
        _detach(settings, names)
        return
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_up(settings, names))
    except START_ERRORS as exc:
        raise fail(str(exc)) from exc


def _detach(settings: Settings, names: list[str]) -> None:
    holder = lock_holder(settings)
    if holder:
        raise fail(str(DataDirBusy(settings.data_dir, holder)))
    try:
        check_data_dir(settings.data_dir, create=True)
    except DataDirUnusable as exc:
        raise fail(str(exc)) from exc
    args = [
        sys.executable,
        "-m",
        "opengyre.cli",
        "up",
        "--data-dir",
        str(settings.data_dir),
        "--services",
        ",".join(names),
        "--stream",
        settings.log.stream,
        "--host",
        settings.host,
    ]
    for url in settings.proxy_engines:
        args += ["--engine", url]
    args += ["--nats-cluster", str(settings.nats_cluster)]
    # Given even when empty: '' sets a recorded URL back to the default.
    if settings.nats_url is not None:
        args += ["--nats-url", settings.nats_url]
    if settings.db_url is not None:
        args += ["--db-url", settings.db_url]
    log_path = settings.data_dir / "up.log"
    with log_path.open("ab") as logf:
        offset = logf.tell()
        # Not tied to this process: the stack outlives the command that started it.
        proc = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        data = stack_alive(settings)
        if data and int(data.get("pid", 0)) == proc.pid:
            if data.get("reaped"):
                console.print(_reaped_text(data["reaped"]))
            console.print(f"stack up in the background (pid {proc.pid}); NATS at {data['nats_url']}")
            return
        if proc.poll() is not None:
            said = _said(log_path, offset)
            raise fail(f"the stack did not start:\n{said[-3000:]}" if said else f"the stack did not start ({log_path})")
        time.sleep(0.2)
    proc.terminate()
    raise fail("the stack did not come up within 120 s")


def _reaped_text(reaped: list[str]) -> str:
    return f"stopped what a stack that died had left running: {', '.join(reaped)}"


def _said(log_path: Path, offset: int) -> str:
    """What the background `up` printed so far."""
    with log_path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace").strip()


def down(data_dir: DataDirOpt = None) -> None:
    """Stop the stack started on this data dir (or what a stack that died left running)."""
    settings = settings_from(data_dir)
    holder = lock_holder(settings)
    if holder and holder.get("role") == "up":
        pid = int(holder["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if not lock_holder(settings):
                console.print(f"stack on {settings.data_dir} stopped")
                return
            time.sleep(0.2)
        raise fail(f"stack pid {pid} did not stop within 60 s")
    if holder:
        console.print(f"no stack runs on {settings.data_dir} ({describe_holder(holder)} reads its log)")
        return
    if not settings.data_dir.is_dir():
        console.print(f"no stack runs on {settings.data_dir}")
        return
    lock = DataDirLock(settings.data_dir)
    try:
        lock.acquire("down", "opengyre down")
    except (DataDirBusy, DataDirUnusable) as exc:
        raise fail(str(exc)) from exc
    try:
        stopped = reap_leftovers(settings)
        settings.stack_file.unlink(missing_ok=True)
    finally:
        lock.release()
    if stopped:
        left = ", ".join(map(str, stopped))
        console.print(f"the stack on {settings.data_dir} had died; stopped what it left: {left}")
    else:
        console.print(f"no stack runs on {settings.data_dir}")


STATUS_DEADLINE_S = 2.0


async def _service_status(host: str, name: str, port: int, token: str | None) -> tuple[str, Any, str]:
    """Health, then GetStatus when serving; each under a short deadline, so a stuck service costs seconds. The
    third value says whether its RPCs require the token: a GetStatus sent without one must be refused."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from ..v1 import common_pb2

    stub_mod = __import__(f"opengyre.v1.{name}_pb2_grpc", fromlist=["x"])
    stub_cls = getattr(stub_mod, f"{name.capitalize()}ServiceStub")
    addr = f"{host}:{port}"
    try:
        async with grpc_channel(addr, token) as ch:
            h = await health_pb2_grpc.HealthStub(ch).Check(
                health_pb2.HealthCheckRequest(service=""), timeout=STATUS_DEADLINE_S
            )
            state = health_pb2.HealthCheckResponse.ServingStatus.Name(h.status)
            auth = await _auth_state(addr, stub_cls)
            if h.status != health_pb2.HealthCheckResponse.SERVING:
                return state, None, auth  # its projections' status would wait on the log it cannot reach
            st = await stub_cls(ch).GetStatus(common_pb2.StatusRequest(), timeout=STATUS_DEADLINE_S)
            return state, st, auth
    except grpc.aio.AioRpcError as exc:
        return exc.code().name, None, "?"


async def _auth_state(addr: str, stub_cls: Any) -> str:
    """'token' when a call without the token is refused (UNAUTHENTICATED), 'OPEN' when it is answered."""
    from ..v1 import common_pb2

    try:
        async with grpc_channel(addr, None) as ch:
            await stub_cls(ch).GetStatus(common_pb2.StatusRequest(), timeout=STATUS_DEADLINE_S)
    except grpc.aio.AioRpcError as exc:
        return "token" if exc.code() == grpc.StatusCode.UNAUTHENTICATED else f"? ({exc.code().name})"
    return "OPEN"


async def _nats_open(url: str) -> bool | None:
    """Whether the NATS server at ``url`` takes a connection without credentials (it must not); None: no answer
    within the deadline (the log's own line says why)."""
    from nats.aio.client import Client

    refused = asyncio.Event()

    async def on_error(exc: Exception) -> None:
        if "authorization" in str(exc).lower():
            refused.set()

    nc = Client()
    connecting = asyncio.ensure_future(
        nc.connect(
            [u.strip() for u in url.split(",") if u.strip()],  # a cluster's seeds
            connect_timeout=int(STATUS_DEADLINE_S),
            allow_reconnect=False,
            error_cb=on_error,
        )
    )
    waiting = asyncio.ensure_future(refused.wait())
    await asyncio.wait({connecting, waiting}, timeout=STATUS_DEADLINE_S, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    opened = connecting.done() and not connecting.cancelled() and connecting.exception() is None
    if not connecting.done():
        connecting.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await connecting
    with contextlib.suppress(Exception):
        await nc.close()
    if opened:
        return True
    return False if refused.is_set() else None


def _nats_users(settings: Settings) -> list[str]:
    """The users the embedded server's config names."""
    try:
        data = json.loads(nats_config_file(settings.data_dir).read_text())
        return [str(u["user"]) for u in data["authorization"]["users"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


async def _log_status(
    url: str, settings: Settings, health_url: str | None, creds: NatsCredentials | None
) -> tuple[str, StreamUsage | None]:
    """('' when the log can take appends, else why not; the stream's bytes against its limit, when known)."""
    try:
        log = await EventLog.connect(
            url, settings.log, timeout=STATUS_DEADLINE_S, create=False, health_url=health_url, credentials=creds
        )
    except LogUnavailable as exc:
        return str(exc), None
    try:
        h = await log.health(timeout=STATUS_DEADLINE_S)
        usage = await asyncio.wait_for(log.usage(), STATUS_DEADLINE_S) if h.ok else None
        return h.reason, usage
    except Exception as exc:
        return f"stream {settings.log.stream}: {type(exc).__name__}: {exc}", None
    finally:
        await log.close()


def _print_nats_nodes(nodes: list[dict[str, Any]]) -> bool:
    """The cluster's members as the supervisor last saw them; whether a majority of them is up."""
    t = Table(title=f"NATS cluster ({len(nodes)} servers)")
    for col in ("server", "address", "pid", "state", "restarts"):
        t.add_column(col)
    up = 0
    for node in nodes:
        ok, pid = bool(node.get("ok")), int(node.get("pid") or 0)
        up += ok and pid > 0
        state = "[green]ok[/]" if ok and pid else f"[red]DOWN[/]: {escape(str(node.get('reason') or 'not running'))}"
        t.add_row(str(node.get("name")), str(node.get("url")), str(pid or "-"), state, str(node.get("restarts", 0)))
    console.print(t)
    return up > len(nodes) // 2


def status(data_dir: DataDirOpt = None) -> None:
    """Show the running stack: the event log, services, what they do and do not do yet, projection lag.

    Exits 1 when no stack runs or a part of it is unhealthy.
    """
    settings = settings_from(data_dir)
    data = stack_alive(settings)
    if not data:
        holder = lock_holder(settings)
        if holder and holder.get("role") == "up":
            raise fail(f"a stack is starting on {settings.data_dir} (supervisor pid {holder.get('pid')})", code=1)
        left = [] if holder else find_leftovers(settings)
        if left:
            raise fail(
                f"no stack runs on {settings.data_dir}, but one that died left {', '.join(map(str, left))} "
                "running: `opengyre down` stops them (`opengyre up` too, before it starts)",
                code=1,
            )
        raise fail(f"no stack runs on {settings.data_dir}: start one with `opengyre up`", code=1)

    token = settings.grpc_token()
    embedded = bool(data.get("embedded_nats"))
    try:
        creds = client_credentials(settings.data_dir, embedded=embedded)
    except ValueError as exc:
        raise fail(str(exc)) from exc

    async def collect() -> tuple[tuple[str, StreamUsage | None], bool | None, list[tuple[str, Any, str]]]:
        # Everything at once: a stack whose log is down answers in one deadline, not one per service.
        log_task = asyncio.create_task(_log_status(data["nats_url"], settings, data.get("nats_monitor_url"), creds))
        open_task = asyncio.create_task(_nats_open(data["nats_url"]))
        svc = [_service_status(data["host"], name, info["port"], token) for name, info in data["services"].items()]
        services = await asyncio.gather(*svc)
        return await log_task, await open_task, services

    (log_problem, usage), nats_open, rows = asyncio.run(collect())
    healthy = not log_problem and not (usage is not None and usage.full)
    recorded = data.get("log") or {}
    where = f"{data['nats_url']}, stream {data.get('stream', settings.log.stream)}"
    if log_problem:
        console.print(f"event log ({where}): [red]DOWN[/]: {log_problem}")
    elif usage is not None and usage.full:
        console.print(
            f"event log ({where}): [red]FULL[/]: {usage.describe()}; appends are refused "
            "(OPENGYRE_LOG_MAX_BYTES: raise it and restart the stack)"
        )
    else:
        console.print(f"event log ({where}): [green]ok[/]" + (f", {usage.describe()}" if usage is not None else ""))
    with contextlib.suppress(OSError):
        free = shutil.disk_usage(settings.data_dir).free
        need = int(data.get("min_free_mb", settings.log_min_free_mb)) * 2**20  # what the supervisor waits for
        if free < need:
            healthy = False
            console.print(
                f"[red]the data dir's disk is full[/]: {free >> 20} MiB free on {settings.data_dir}; the stack "
                f"runs on and restarts what stopped once {need >> 20} MiB are free (OPENGYRE_LOG_MIN_FREE_MB)"
            )
    if nats_open is None:
        console.print(f"NATS at {data['nats_url']}: no answer, cannot tell whether it requires credentials")
    elif nats_open:
        console.print(
            f"[yellow]NATS at {data['nats_url']} takes connections without credentials[/]: any process that "
            "reaches it can append events"
        )
    elif embedded:
        console.print(
            f"NATS requires credentials; users: {', '.join(_nats_users(settings)) or '?'} "
            f"(passwords in {settings.data_dir / 'auth' / 'nats'}, 0600)"
        )
    else:
        console.print(f"NATS requires credentials; this command connects as {creds!r}")
    nodes = (read_stack_file(settings) or data).get("nats_nodes") or []
    if nodes:
        healthy = _print_nats_nodes(nodes) and healthy
    elif recorded.get("restarts"):
        console.print(f"nats-server restarted {recorded['restarts']} time(s) by the supervisor")
    t = Table(title=f"stack on {settings.data_dir} (supervisor pid {data['pid']})")
    for col in ("service", "address", "auth", "pid", "state", "projections (position/pending/dead)", "not implemented"):
        t.add_column(col)
    refusing: list[str] = []
    notes: list[str] = []
    # The supervisor rewrites its record when it restarts a service: read it after the services answered, and
    # show a pid only while it is that service (a killed one the supervisor has not restarted yet is not).
    now = (read_stack_file(settings) or data)["services"]
    for (name, info), (state, st, auth) in zip(data["services"].items(), rows, strict=True):
        addr = f"{data['host']}:{info['port']}"
        auth_text = "[green]token[/]" if auth == "token" else f"[red]{escape(auth)}[/]"
        rec = now.get(name, info)
        pid, restarts = int(rec.get("pid") or 0), int(rec.get("restarts") or 0)
        running = is_service_of(pid, name, settings.data_dir)
        shown = (str(pid) if running else "-") + (f" ({restarts} restarts)" if restarts else "")
        if pid and not running:  # no pid recorded: a service this supervisor did not spawn; its gRPC tells
            healthy = False
            t.add_row(name, addr, auth_text, shown, "[red]exited[/]", "", "")
            continue
        if st is None or state != "SERVING":
            healthy = False
            t.add_row(name, addr, auth_text, shown, f"[red]{state.lower().replace('_', ' ')}[/]", "", "")
            continue
        projs = ", ".join(
            f"{p.name} {p.position}/{p.pending}/{p.dead_letters}" + (" [red]REFUSES THE STREAM[/]" if p.error else "")
            for p in st.projections
        )
        refusing += [p.error for p in st.projections if p.error]
        notes += [f"{name}: {n}" for n in st.notes]
        t.add_row(name, addr, auth_text, shown, "[green]serving[/]", projs or "-", ", ".join(st.not_implemented) or "-")
    console.print(t)
    console.print(_exposure_text(data["host"]))
    recorded_limits = data.get("http_limits")
    console.print(_http_limits_text(None if recorded_limits is None else HttpLimits.from_env(recorded_limits)))
    for note in notes:
        console.print(f"[yellow]note:[/] {escape(note)}")
    for why in refusing:
        console.print(f"[bold red]error:[/] {escape(why)}")
    if refusing or not healthy:
        raise typer.Exit(1)


def _http_limits_text(limits: HttpLimits | None) -> str:
    if limits is None:
        return "HTTP limits: not recorded (a supervisor older than the limits: it serves without them)"
    return f"HTTP limits (gateway, engines, /metrics; OPENGYRE_HTTP_*, docs/security.md): {limits.describe()}"


def _exposure_text(host: str) -> str:
    """Who can reach the services' gRPC ports and the proxy's HTTP gateway."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        loopback = False  # a name: whatever it resolves to, it may be reachable
    if loopback:
        return f"gRPC and the proxy's HTTP gateway listen on {host} (this machine only)"
    return (
        f"[yellow]gRPC and the proxy's HTTP gateway listen on {host}: reachable from other machines[/] "
        "(gRPC still requires the token; `opengyre up --host 127.0.0.1` closes them)"
    )


def service_run(
    name: Annotated[str, typer.Argument(help="Service to run")],
    port: Annotated[int | None, typer.Option(help="gRPC port [default: the service's own]")] = None,
    port_fallback: Annotated[bool, typer.Option(help="serve on a free port if --port is taken")] = False,
    port_file: Annotated[Path | None, typer.Option(help="write the bound gRPC port here once serving")] = None,
    data_dir: DataDirOpt = None,
    nats_url: NatsUrlOpt = None,
    db_url: DbUrlOpt = None,
) -> None:
    """Run one service in the foreground (what `opengyre up` starts per service)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per health check of the log
    settings = settings_from(data_dir, nats_url, db_url)
    try:
        service = load_service(name)
    except KeyError as exc:
        raise fail(str(exc)) from exc
    # Started by `opengyre up`: stop when the supervisor is gone (besides the parent-death signal).
    supervisor = os.environ.get("OPENGYRE_SUPERVISOR_PID")
    try:
        grace_s = stop_grace_s()
    except ValueError as exc:
        raise fail(str(exc)) from exc

    async def main() -> None:
        stop = asyncio.Event()
        _install_stop_signals(stop)
        # Asked to stop (a signal, the supervisor gone), the process ends within the grace whatever hangs.
        watchdog = asyncio.create_task(exit_if_stop_hangs(stop, f"svc-{name}", grace_s), name="stop-deadline")
        try:
            await run_service(
                service,
                settings,
                stop,
                port=port,
                port_fallback=port_fallback,
                port_file=port_file,
                supervisor_pid=int(supervisor) if supervisor else None,
            )
        finally:
            # The loop's own teardown (cancelled tasks, the default executor's threads) is covered too: the
            # deadline is armed here unless the watchdog already armed it (once; a second timer would only race).
            if not watchdog.done():
                watchdog.cancel()
                exit_after(grace_s, f"svc-{name}")

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
