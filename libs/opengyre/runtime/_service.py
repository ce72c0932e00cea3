"""What every OpenGyre service shares: connect to the log, migrate, run its projections, serve gRPC."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar

import grpc
from sqlalchemy import Engine

from ..config import Settings, ensure_grpc_token, installed_services
from ..eventlog import EventLog
from ..projection import Projection, ProjectionRunner, StreamMismatch
from ..store import create_db_engine, migrate
from ..v1 import common_pb2
from ._grpc import GrpcServer
from ._natsauth import env_credentials

__all__ = [
    "SERVICE_CLASSES",
    "SERVICE_NEEDS",
    "Service",
    "ServiceContext",
    "all_projections",
    "load_service",
    "projection_owners",
    "run_service",
]

log = logging.getLogger(__name__)

VERSION = "0.1.0"

# Where each service's class lives; imported lazily so the CLI does not pay for torch on every call.
SERVICE_CLASSES: dict[str, str] = installed_services()
# Services whose start needs another's gRPC address (the scheduler drains cells through the proxy): `opengyre up`
# starts them once those have bound and reported their ports.
SERVICE_NEEDS: dict[str, tuple[str, ...]] = {"scheduler": ("proxy",)}


@dataclass
class ServiceContext:
    settings: Settings
    log: EventLog
    engine: Engine
    runners: dict[str, ProjectionRunner] = field(default_factory=dict)

    async def status(self, service: Service) -> common_pb2.ServiceStatus:
        msg = common_pb2.ServiceStatus(
            service=service.name,
            version=VERSION,
            capabilities=list(service.capabilities),
            not_implemented=list(service.not_implemented),
        )
        for runner in self.runners.values():
            st = await runner.status()
            msg.projections.append(
                common_pb2.ProjectionStatus(
                    name=st.name,
                    position=st.position,
                    stream_last_seq=st.stream_last_seq,
                    pending=st.pending,
                    tracked=st.tracked,
                    dead_letters=st.dead_letters,
                    error=st.error or "",
                )
            )
        msg.notes.extend(await service.notes(self))
        return msg


class Service(ABC):
    """One OpenGyre service: its projections, its gRPC servicer, and any extra servers it runs."""

    name: ClassVar[str]
    summary: ClassVar[str]
    capabilities: ClassVar[Sequence[str]] = ()
    not_implemented: ClassVar[Sequence[str]] = ()

    def projections(self) -> Sequence[Projection]:
        return ()

    @abstractmethod
    def add_to_server(self, server: grpc.aio.Server, ctx: ServiceContext) -> Sequence[str]:
        """Register servicers; return their full names (``opengyre.v1.XService``) for health and reflection."""

    async def notes(self, ctx: ServiceContext) -> Sequence[str]:
        """What the service is waiting on, in words, for its status (``opengyre status`` shows them)."""
        return ()

    async def start(self, ctx: ServiceContext) -> None:
        """Start extra servers or background tasks (after projections, before gRPC)."""
        return None

    async def stop(self) -> None:
        """Stop what ``start`` started."""
        return None


def load_service(name: str) -> Service:
    target = SERVICE_CLASSES.get(name)
    if target is None:
        raise KeyError(f"unknown service {name!r}; known: {', '.join(SERVICE_CLASSES)}")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    service = cls()
    if not isinstance(service, Service):
        raise TypeError(f"{target} is not a Service")
    return service


def all_projections() -> dict[str, Projection]:
    return {name: p for name, (_svc, p) in projection_owners().items()}


def projection_owners() -> dict[str, tuple[str, Projection]]:
    """Every projection by name, with the service that owns it (and keeps it in its own store)."""
    out: dict[str, tuple[str, Projection]] = {}
    for name in SERVICE_CLASSES:
        for p in load_service(name).projections():
            out[p.name] = (name, p)
    return out


async def _watch_log(event_log: EventLog, server: GrpcServer, stop: asyncio.Event, every: float = 1.0) -> None:
    """Health follows the log: NOT_SERVING while it is unreachable or cannot store, SERVING again after."""
    while not stop.is_set():
        h = await event_log.health()
        if h.ok != server.serving:
            if h.ok:
                log.warning("the event log is back: serving")
            else:
                log.warning("not serving: %s", h.reason)
            await server.set_serving(h.ok)
        await event_log.watch.wait_changed(every)


async def _watch_parent(pid: int, stop: asyncio.Event, every: float = 1.0) -> None:
    """Stop when the supervisor that started us is gone (the parent-death signal's fallback)."""
    while not stop.is_set():
        if os.getppid() != pid:
            log.error("the supervisor (pid %d) is gone: stopping", pid)
            stop.set()
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


async def run_service(
    service: Service,
    settings: Settings,
    stop: asyncio.Event,
    *,
    port: int | None = None,
    port_fallback: bool = False,
    port_file: Path | None = None,
    ready: asyncio.Future[int] | None = None,
    supervisor_pid: int | None = None,
) -> None:
    """Run until ``stop`` is set. The gRPC port is ``port`` (else the settings'); ``port_fallback``: a free one if
    that is taken. Once serving, the bound port goes to ``ready`` and to ``port_file`` (how a supervisor learns
    it: a check that a port is free, made before the bind, races with every other process). ``supervisor_pid``:
    stop when that process (our parent) is gone."""
    url = settings.resolved_nats_url()
    if not url:
        raise RuntimeError("no NATS URL: pass --nats-url or start the stack with `opengyre up`")
    # Who we are to NATS: the supervisor names our user (OPENGYRE_NATS_USER/PASSWORD), as the user does for an
    # external --nats-url; none named: a server that requires no credentials.
    creds = env_credentials()
    # Under a supervisor the stream is the stack's (``up`` created and configured it): a missing one is an error,
    # not something to re-create with defaults. Alone (a bare nats-server) the service creates a missing one.
    event_log = await EventLog.connect(
        url, settings.log, health_url=settings.nats_monitor_url, credentials=creds, create=supervisor_pid is None
    )
    settings.ensure_store_dir()
    engine = create_db_engine(settings.store_url(service.name))
    tasks: list[asyncio.Task[None]] = []
    watchers: list[asyncio.Task[None]] = []
    if supervisor_pid is not None:
        watchers.append(asyncio.create_task(_watch_parent(supervisor_pid, stop), name="watch-supervisor"))
    server: GrpcServer | None = None
    try:
        await asyncio.to_thread(migrate, engine)
        # Bound first: the service's own start may need its address (the scheduler hands it to the cells it starts).
        want = settings.ports[service.name] if port is None else port
        # The data dir's token (`opengyre up` writes it first; a service run alone on a fresh data dir writes it).
        token = settings.grpc_token_override or ensure_grpc_token(settings.data_dir)
        server = GrpcServer(settings.host, want, token=token, fallback=port_fallback)
        settings = replace(settings, ports={**settings.ports, service.name: server.port})
        ctx = ServiceContext(settings=settings, log=event_log, engine=engine)
        for projection in service.projections():
            runner = ProjectionRunner(projection, event_log, engine)
            with contextlib.suppress(StreamMismatch):  # ``run`` reports it and keeps the service up to say so
                await runner.ensure_consumer()
            ctx.runners[projection.name] = runner
            tasks.append(asyncio.create_task(runner.run(stop), name=f"projection-{projection.name}"))
        await service.start(ctx)
        server.register(service.add_to_server(server.server, ctx))
        await server.start()
        if port_file is not None:
            await asyncio.to_thread(_write_atomic, port_file, f"{server.port}\n")
        watchers.append(asyncio.create_task(_watch_log(event_log, server, stop), name="watch-log"))
        log.info("%s serving gRPC on %s:%d", service.name, settings.host, server.port)
        if ready is not None and not ready.done():
            ready.set_result(server.port)
        stopper = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
        for t in tasks:
            exc = t.exception() if t.done() and not t.cancelled() else None
            if exc is not None:
                # A projection that cannot go on ends the process; the supervisor restarts it and the
                # projection resumes from its tracking rows.
                raise exc
    finally:
        stop.set()
        for w in watchers:
            w.cancel()
        await asyncio.gather(*watchers, return_exceptions=True)
        if server is not None:
            await server.stop()
        with contextlib.suppress(Exception):
            await service.stop()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await event_log.close()
        engine.dispose()


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk: the service exits, and its supervisor restarts it once there is room
        raise
    tmp.replace(path)  # a reader never sees half a port
